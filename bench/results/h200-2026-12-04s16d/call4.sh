#!/usr/bin/env bash
# Session 16, call 4: the final binaries — every GPU test as gpu-check.sh runs them (one thread),
# the fp8 gemv split, TTFT and decode bf16 vs fp8.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s16/new.txz -C /tmp/b
B=/tmp/b/s16
{
for q in none fp8; do
  export BROOK_QUANTIZATION=$q
  timeout 60 $B/gpu-bench decode --model llama-2-7b --quick
  timeout 60 $B/gpu-bench ttft --model llama-2-7b --input-len 2048
done
} > $OUT/bench.jsonl 2>> $OUT/bench.log
unset BROOK_QUANTIZATION
{
echo "== cuda_kernels"; timeout 200 $B/cuda_kernels --test-threads=4 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_e2e (one thread)"; timeout 200 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
echo "== cuda_models"; timeout 100 $B/cuda_models --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_ws"; timeout 60 $B/cuda_ws --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked" | head
} > $OUT/log.txt 2>&1
echo done >> $OUT/log.txt
