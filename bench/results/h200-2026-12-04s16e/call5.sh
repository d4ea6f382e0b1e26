#!/usr/bin/env bash
# Session 16, call 5: the refactored fp8/bf16 tests at the final commit; fp8 TTFT breakdown.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s16/new.txz -C /tmp/b
B=/tmp/b/s16
{
echo "== cuda_kernels gemv fp8"; timeout 150 $B/cuda_kernels --test-threads=4 gemv fp8_weights 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_e2e (one thread)"; timeout 200 $B/cuda_e2e --test-threads=1 --nocapture > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked|fp8 vs bf16" $OUT/e2e.txt | head -20
} > $OUT/log.txt 2>&1
BROOK_QUANTIZATION=fp8 timeout 150 $B/gpu-bench ttft --model llama-2-7b --input-len 2048 --breakdown > $OUT/bench.jsonl 2>> $OUT/bench.log
echo done >> $OUT/log.txt
