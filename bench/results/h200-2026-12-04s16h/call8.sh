#!/usr/bin/env bash
# Session 16, call 8: one E4m3Quantizer for weights and activations, no lock on the plans: fp8 tests,
# the e2e suite, fp8 TTFT and decode once.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s16/new.txz -C /tmp/b
B=/tmp/b/s16
{
echo "== cuda_kernels fp8_weights gemm gemv"; timeout 100 $B/cuda_kernels --test-threads=4 fp8_weights gemm gemv 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_e2e (one thread)"; timeout 150 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
} > $OUT/log.txt 2>&1
export BROOK_QUANTIZATION=fp8
{ timeout 60 $B/gpu-bench ttft --model llama-2-7b --input-len 2048; timeout 60 $B/gpu-bench decode --model llama-2-7b --quick; } > $OUT/bench.jsonl 2>> $OUT/bench.log
echo done >> $OUT/log.txt
