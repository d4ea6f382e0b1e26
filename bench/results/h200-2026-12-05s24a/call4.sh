#!/usr/bin/env bash
# Session 24, call 4: gpu-bench elementwise — add_rmsnorm and silu_mul alone at 512 and 2048
# tokens (GB/s against copy), and the gate|up GEMM over random input vs zeros (how much of
# call 3's "norms left out" rows a GEMM over unwritten input can explain).
# Carry: .carry/gb24 (gpu-bench of this commit, xz)
mkdir -p /tmp/gb24 && xz -dc .carry/gb24/gpu-bench.xz > /tmp/gb24/gpu-bench && chmod +x /tmp/gb24/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
timeout 200 /tmp/gb24/gpu-bench elementwise --model llama-2-7b --tokens 512,2048 --reps 5 >"$OUT/elementwise.jsonl" 2>"$OUT/elementwise.log"
echo "rc $?"
grep -v INFO "$OUT/elementwise.log" | tail -20
