#!/usr/bin/env bash
# Session 39, call 2 (binaries .carry/gb39a as call 1; carry [".carry/gb39a"]). Call 1 (H100):
# tight tied roomy at batch 1 and was 1.4 % / 0.6 % faster at batch 2 / 4 (4k), one run each.
# Here batch 2, 3 and 4 at 4k and batch 1 at 4k, alternated three times.
set -u
mkdir -p /tmp/gb "$OUT/o2" || exit 1
xz -dc .carry/gb39a/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # mode, then gpu-bench args
  local t=$1; shift
  BROOK_GEMV_SMEM=$t timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2 3; do
  for b in 2 4 3 1; do
    for t in roomy tight; do run $t decode-batch --model llama-2-7b --batch $b --context 4000 --steps 24; done
  done
done
for t in roomy tight; do run $t decode-batch --model llama-3-8b --batch 4 --context 4000 --steps 24; done
cd $OUT && tar czf o2.tgz o2 && rm -rf o2
true
