#!/usr/bin/env bash
# Session 19, call 8 (binaries of the commit after e20a921 that moves both prefill kernels' ends
# into pf_finish): prefill kernel tests (both kernels, every head dim), CUDA-vs-CPU tests,
# prefill-chunks for Llama-2-7B (the mma.sync kernel's times against call 6).
R=$PWD
tar xJf .carry/s19/new.txz -C /tmp && B=/tmp/s19
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 120 ./cuda_kernels prefill --test-threads 4) > $OUT/tests.log 2>&1
(time timeout 60 ./cuda_e2e --test-threads=1) > $OUT/e2e.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log $OUT/e2e.log | head
timeout 80 ./gpu-bench prefill-chunks --model llama-2-7b > $OUT/chunks.jsonl 2> $OUT/chunks.log
python3 -c "
import json
for l in open('$OUT/chunks.jsonl'):
    d=json.loads(l)
    for r in d['rows']: print(d['model'], r['ctx'], r['chunk'], r['splits'], round(r['unsplit_us'],1), round(r['split_us'],1), 'mma', round(r['mma_sync_us'],1), round(r['mma_sync_split_us'],1))"
