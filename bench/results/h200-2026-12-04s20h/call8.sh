#!/usr/bin/env bash
# Session 20, call 8: after the review (the two pipelined loops share one body, the TMA builds
# named _tma_st{S} and loaded by one helper): prefill kernel tests (every build), CUDA-vs-CPU,
# prefill-chunks for Llama-2-7B, TTFT.
R=$PWD
tar xJf .carry/s20/new.txz -C /tmp && B=/tmp/s20
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 200 ./cuda_kernels prefill --test-threads 2) > $OUT/tests.log 2>&1
(time timeout 120 ./cuda_e2e --test-threads=1) > $OUT/e2e.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log $OUT/e2e.log | head
timeout 150 ./gpu-bench prefill-chunks --model llama-2-7b > $OUT/chunks.jsonl 2> $OUT/chunks.log
python3 -c "
import json
for l in open('$OUT/chunks.jsonl'):
    d=json.loads(l)
    for r in d['rows']:
        print(d['model'], r['ctx'], r['chunk'], 'rule', r['splits'], r['kernel'], round(r['split_us'],1), {k[18:]: round(v,1) for k,v in r['wg_stages_split_us'].items()})"
for i in 1 2; do
  timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done
python3 -c "
import json
for l in open('$OUT/ttft.jsonl'):
    d=json.loads(l); print(d['model'],d['kv_cache_dtype'],d['input_len'],'tma',d['prefill_tma'],'stages',d['prefill_wg_stages'],round(d['median_ms'],2))"
