#!/usr/bin/env bash
# Session 39, call 4 (binaries .carry/gb39a as call 1; carry [".carry/gb39a"]). Call 1 (H100):
# tight tied roomy at batch 1 and was 1.4 % / 0.6 % faster at batch 2 / 4 (4k), one run each.
# Call 2: batch 2-4 of Llama-2-7B 0.1-1.6 % faster in 10 of 11 pairs, batch 1 tied, Llama-3-8B
# batch 4 1.2 % slower (one pair). Call 3: Llama-3-8B batch 2-4 0.1-1.9 % faster in 8 of 9 pairs.
# Here batch 1 (`decode --quick`, 128 tokens) of both models, alternated three times.
set -u
mkdir -p /tmp/gb "$OUT/o4" || exit 1
xz -dc .carry/gb39a/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # mode, then gpu-bench args
  local t=$1; shift
  BROOK_GEMV_SMEM=$t timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2 3; do
  for m in llama-2-7b llama-3-8b; do
    for t in roomy tight; do run $t decode --quick --model $m --input-len 128 --output-len 256; done
  done
done
cd $OUT && tar czf o4.tgz o4 && rm -rf o4
true
