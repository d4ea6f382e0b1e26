#!/usr/bin/env bash
# Session 19, call 6: the wgmma prefill kernel walking its tiles in reverse (later, longer tiles
# first): prefill kernel tests, CUDA-vs-CPU tests, prefill-chunks, TTFT A/B.
R=$PWD
tar xJf .carry/s19/new.txz -C /tmp && B=/tmp/s19
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 150 ./cuda_kernels prefill --test-threads 2) > $OUT/tests.log 2>&1
(time timeout 100 ./cuda_e2e --test-threads=1) > $OUT/e2e.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log $OUT/e2e.log | head
timeout 200 ./gpu-bench prefill-chunks --model llama-2-7b,llama-3-8b > $OUT/chunks.jsonl 2> $OUT/chunks.log
python3 -c "
import json
for l in open('$OUT/chunks.jsonl'):
    d=json.loads(l)
    for r in d['rows']: print(d['model'], r['ctx'], r['chunk'], r['splits'], round(r['unsplit_us'],1), round(r['split_us'],1), 'mma', round(r['mma_sync_us'],1), round(r['mma_sync_split_us'],1))"
for i in 1 2; do for w in 1 0; do
  BROOK_PREFILL_WGMMA=$w timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done; done
BROOK_QUANTIZATION=fp8 timeout 60 ./gpu-bench ttft --model llama-3-8b --input-len 2048 --kv-cache-dtype fp8 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
python3 -c "
import json
for l in open('$OUT/ttft.jsonl'):
    d=json.loads(l); print(d['model'],d['quantization'],d['kv_cache_dtype'],d['input_len'],'wgmma' if d['prefill_wgmma'] else 'mma.sync',round(d['median_ms'],2))"
