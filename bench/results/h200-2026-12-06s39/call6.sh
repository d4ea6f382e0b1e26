#!/usr/bin/env bash
# Session 39, call 6 (binaries .carry/gb39b as call 5, on the machine it left warm; carry
# [".carry/gb39b"]). Call 5 had tight 0.3 % behind roomy at batch 1 in both pairs (calls 1 and 4
# on 7b052f9's build: tied); four more pairs at batch 1.
set -u
mkdir -p /tmp/gb "$OUT/o6" || exit 1
xz -dc .carry/gb39b/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o6
run() { # mode, then gpu-bench args
  local t=$1; shift
  BROOK_GEMV_SMEM=$t timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2 3 4; do
  for t in roomy tight; do run $t decode --quick --model llama-2-7b --output-len 256; done
done
cd $OUT && tar czf o6.tgz o6 && rm -rf o6
true
