#!/usr/bin/env bash
# Session 37, call 12 (gpu-bench of this tree: .carry/gb37i; carry [".carry/gb37i"]). The stream
# floor with the tight and two-CTAs-an-SM (16-stage) builds of the bulk gemv, Llama-2-7B and
# Llama-3-8B (each run two rounds).
set -u
mkdir -p /tmp/gb "$OUT/o12" && xz -dc .carry/gb37i/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o12
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for m in llama-2-7b llama-3-8b; do
  timeout 150 /tmp/gb/gpu-bench stream-floor --model $m > $O/floor-$m.jsonl 2> $O/floor-$m.log
  echo "stream-floor $m rc $?"; grep "stream floor" $O/floor-$m.log | sed 's/ for .* launches,/:/'
done
cd $OUT && tar czf o12.tgz o12 && rm -rf o12
true
