#!/usr/bin/env bash
# NOT RUN: four starts were refused (no machine of either kind) and the device time ran out.
# Session 38, call 8 (binaries: scripts/gpu-pack.sh .carry/gb38g at f85503c, the stop's kernels:
# the L2 prefetch in the lane kernel only; .carry/gb37l the baseline; carry [".carry/gb38g",
# ".carry/gb37l"]): the decode kernel's GPU tests on the final build, as in call 6 (the device
# time left after refused starts allowed no more).
set -u
mkdir -p /tmp/gb /tmp/base "$OUT/o8" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb38g/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb37l/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o8
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # label, binary, gpu-bench args
  local l=$1 b=$2; shift 2
  timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/decode.txt
}
timeout 40 /tmp/gb/cuda_e2e --test-threads 2 mha_hd128 gqa_hd64 cluster_merged small_batches > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
timeout 110 /tmp/gb/cuda_kernels paged_decode > $O/kernels.log 2>&1; echo "cuda_kernels paged_decode rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -6
cd $OUT && tar czf o8.tgz o8 && rm -rf o8
true
