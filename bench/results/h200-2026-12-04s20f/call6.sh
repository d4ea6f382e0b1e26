#!/usr/bin/env bash
# Session 20, call 6: the final code (TMA prefill attention on by default, the gemv prefetch
# reverted, the split rule's half-wave minimum): every CUDA test but the long paged-decode
# sweeps, CUDA-vs-CPU, models, WebSocket; TTFT A/B (BROOK_PREFILL_TMA), decode b1 sanity,
# prefill-chunks for Llama-3-8B's GQA heads.
R=$PWD
tar xJf .carry/s20/new.txz -C /tmp && B=/tmp/s20
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 200 ./cuda_kernels --skip paged_decode --test-threads 4) > $OUT/tests.log 2>&1
(time timeout 120 ./cuda_e2e --test-threads=1) > $OUT/e2e.log 2>&1
(time timeout 60 ./cuda_models --test-threads=1) > $OUT/models.log 2>&1
(time timeout 60 ./cuda_ws --test-threads=1) > $OUT/ws.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log $OUT/e2e.log $OUT/models.log $OUT/ws.log | head
for i in 1 2; do for t in 1 0; do
  BROOK_PREFILL_TMA=$t timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done; done
for t in 1 0; do
  BROOK_PREFILL_TMA=$t timeout 60 ./gpu-bench ttft --model llama-3-8b --input-len 8000 --kv-cache-dtype bf16 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done
python3 -c "
import json
for l in open('$OUT/ttft.jsonl'):
    d=json.loads(l); print(d['model'],d['quantization'],d['kv_cache_dtype'],d['input_len'],'tma',d['prefill_tma'],round(d['median_ms'],2))"
timeout 60 ./gpu-bench decode --quick --output-len 512 > $OUT/decode.jsonl 2>> $OUT/bench.log
python3 -c "
import json
for l in open('$OUT/decode.jsonl'):
    d=json.loads(l); print('decode b1', d['model'], round(d['median_ms'],3))"
timeout 120 ./gpu-bench prefill-chunks --model llama-3-8b > $OUT/chunks.jsonl 2> $OUT/chunks.log
python3 -c "
import json
for l in open('$OUT/chunks.jsonl'):
    d=json.loads(l)
    for r in d['rows']:
        print(d['model'], r['ctx'], r['chunk'], 'rule', r['splits'], 'tma', round(r['split_us'],1), {k[-4:]: round(v,1) for k,v in r['wg_stages_split_us'].items()})"
