#!/usr/bin/env bash
# Session 38, call 1 (binaries .carry/gb38a = this tree's gpu-bench and GPU tests, .carry/gb37l =
# 800b2a1's gpu-bench, the baseline; carry [".carry/gb38a", ".carry/gb37l"]): RoPE and the K/V
# write in the bulk QKV projection (gemv_bulk_rope): its kernel and e2e tests, then batch-1
# decode with it off (0), early trigger (1) and late (2), beside the baseline build.
set -u
mkdir -p /tmp/gb /tmp/base "$OUT/o1" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb38a/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb37l/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/cuda_kernels gemv_bulk rope_kv > $O/kernels.log 2>&1; echo "cuda_kernels gemv_bulk rope_kv rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -8
timeout 150 /tmp/gb/cuda_e2e --test-threads 2 rope_in_the_qkv small_batches_on_gemv > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -8
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
  run base /tmp/base/gpu-bench decode --quick --model $m --output-len 256
  for q in 0 1 2; do
    BROOK_QKV_ROPE=$q run qkv_rope=$q /tmp/gb/gpu-bench decode --quick --model $m --output-len 256
  done
done
cd $OUT && tar czf o1.tgz o1 && rm -rf o1
true
