#!/usr/bin/env bash
# Session 40, call 1 (binaries: scripts/gpu-pack.sh .carry/gb40b at c67f6aa + the GB_DIAG 3 build in stream-floor (committed next);
# carry [".carry/gb40b"]). The GPU tests of that build (all of cuda_e2e and cuda_kernels), then
# `stream-floor` with its boundary stamps (first run), then roomy against tight at batch 1 and 2.
set -u
mkdir -p /tmp/gb "$OUT/o1" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb40b/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 100 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
timeout 200 /tmp/gb/cuda_kernels > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -6
for m in llama-2-7b llama-3-8b; do
  timeout 90 /tmp/gb/gpu-bench stream-floor --model $m > $O/sf-$m.json 2> $O/sf-$m.log; echo "stream-floor $m rc $?"
done
run() { # mode, then gpu-bench args
  local t=$1; shift
  BROOK_GEMV_SMEM=$t timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for t in roomy tight; do
    run $t decode --quick --model llama-2-7b --output-len 256
    run $t decode-batch --model llama-2-7b --batch 2 --context 4000 --steps 24
  done
done
cd $OUT && tar czf o1.tgz o1 && rm -rf o1
true
