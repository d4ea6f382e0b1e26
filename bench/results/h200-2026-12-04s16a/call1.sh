#!/usr/bin/env bash
# Session 16, call 1: fp8 weights tests and benchmarks.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
mkdir -p /tmp/b && tar xJf .carry/s16/new.txz -C /tmp/b
B=/tmp/b/s16
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/log.txt 2>&1
{
echo "== cuda_kernels fp8 gemv gemm"; timeout 120 $B/cuda_kernels --test-threads=4 fp8 2>&1 | tail -15
timeout 120 $B/cuda_kernels --test-threads=4 gemv 2>&1 | tail -4
timeout 60 $B/cuda_kernels --test-threads=4 gemm 2>&1 | tail -4
echo "== cuda_e2e weights_fp8 (nocapture)"; timeout 150 $B/cuda_e2e --test-threads=1 weights_fp8 --nocapture 2>&1 | grep -E "fp8 vs bf16|test result|panicked|FAILED|error" | head -20
} >> $OUT/log.txt 2>&1
{
for q in none fp8; do
  export BROOK_QUANTIZATION=$q
  timeout 60 $B/gpu-bench ttft --model llama-2-7b --input-len 2048
  timeout 60 $B/gpu-bench decode --model llama-2-7b --quick
  timeout 90 $B/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype bf16,fp8
done
} > $OUT/bench.jsonl 2>> $OUT/bench.log
unset BROOK_QUANTIZATION
{
echo "== cuda_kernels all"; timeout 150 $B/cuda_kernels --test-threads=4 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_e2e all"; timeout 120 $B/cuda_e2e --test-threads=2 2>&1 | grep -E "test result|FAILED|panicked" | head
} >> $OUT/log.txt 2>&1
timeout 60 $B/gpu-bench prefill-chunks --model llama-2-7b,llama-3-8b > $OUT/chunks.jsonl 2>> $OUT/bench.log
echo done >> $OUT/log.txt
