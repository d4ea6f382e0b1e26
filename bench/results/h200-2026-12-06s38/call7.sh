#!/usr/bin/env bash
# Session 38, call 7 (binaries .carry/gb38f, .carry/gb37l as call 6; carry [".carry/gb38f",
# ".carry/gb37l"]): the L2 prefetch before the decode kernels' wait against the baseline,
# alternated three times at batch 1 (call 6: -0.2 to -0.3 % for Llama-2-7B, mixed for
# Llama-3-8B, one run each).
set -u
mkdir -p /tmp/gb /tmp/base "$OUT/o7" || exit 1
xz -dc .carry/gb38f/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
xz -dc .carry/gb37l/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o7
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # label, binary, gpu-bench args
  local l=$1 b=$2; shift 2
  timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/decode.txt
}
for r in 1 2 3; do
  for m in "llama-2-7b --input-len 128" "llama-2-7b --input-len 3800" "llama-3-8b --input-len 128" "llama-3-8b --input-len 3800"; do
    run base /tmp/base/gpu-bench decode --quick --model $m --output-len 256
    run new /tmp/gb/gpu-bench decode --quick --model $m --output-len 256
  done
done
cd $OUT && tar czf o7.tgz o7 && rm -rf o7
true
