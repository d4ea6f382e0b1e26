#!/usr/bin/env bash
# Session 39, call 5 (binaries: scripts/gpu-pack.sh .carry/gb39b at 0462161, the stop's build:
# `GemvSmem::Tight` by default, the accumulator in dynamic shared memory, the ring's stage count
# compile-time again; carry [".carry/gb39b", ".carry/gb38g"]). The GPU tests of the final build
# (all of cuda_e2e and cuda_kernels), then the session's start (.carry/gb38g = f85503c), roomy and
# the default (tight) at batch 1 and 2, alternated twice.
set -u
mkdir -p /tmp/gb "$OUT/o5" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb39b/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
mkdir -p /tmp/base && xz -dc .carry/gb38g/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o5
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 100 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
timeout 170 /tmp/gb/cuda_kernels > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -6
run() { # mode (base: the session's start), then gpu-bench args
  local t=$1 b=/tmp/gb/gpu-bench; shift
  [ $t = base ] && b=/tmp/base/gpu-bench
  BROOK_GEMV_SMEM=$t timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for t in base roomy tight; do
    run $t decode --quick --model llama-2-7b --output-len 256
    run $t decode-batch --model llama-2-7b --batch 2 --context 4000 --steps 24
  done
done
cd $OUT && tar czf o5.tgz o5 && rm -rf o5
true
