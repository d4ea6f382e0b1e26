#!/usr/bin/env bash
# Session 38, call 4 (binaries .carry/gb38d: decode attention after the early-trigger fused QKV
# projection asks for the shared memory that holds its CTAs to ceil(CTAs / SMs) an SM,
# Gpu::spread_smem; carry [".carry/gb38d", ".carry/gb37l"]): decode kernel tests (their second
# launch spreads), the fused e2e test, then batch-1 decode off / early+spread / late.
set -u
mkdir -p /tmp/gb /tmp/base "$OUT/o4" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb38d/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb37l/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # label, binary, gpu-bench args
  local l=$1 b=$2; shift 2
  timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/decode.txt
}
for r in 1 2; do
  run base /tmp/base/gpu-bench decode --quick --model llama-2-7b --output-len 256
  for q in 0 1 2; do
    BROOK_QKV_ROPE=$q run qkv_rope=$q /tmp/gb/gpu-bench decode --quick --model llama-2-7b --output-len 256
  done
done
for m in "llama-2-7b --input-len 3800" "llama-3-8b"; do
  for q in 0 1 2; do
    BROOK_QKV_ROPE=$q run qkv_rope=$q /tmp/gb/gpu-bench decode --quick --model $m --output-len 256
  done
done
timeout 100 /tmp/gb/cuda_e2e --test-threads 2 rope_in_the_qkv > $O/e2e.log 2>&1; echo "cuda_e2e rope_in_the_qkv rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -4
timeout 200 /tmp/gb/cuda_kernels paged_decode_inline paged_decode_filled paged_decode_cluster paged_decode_fp8_batches > $O/kernels.log 2>&1; echo "cuda_kernels paged_decode (spread) rc $?"
grep -h "^test \|test result\|panicked" $O/kernels.log | head -8
cd $OUT && tar czf o4.tgz o4 && rm -rf o4
true
