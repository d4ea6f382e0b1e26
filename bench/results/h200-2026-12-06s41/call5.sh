#!/usr/bin/env bash
# Session 41, call 5 (binaries: scripts/gpu-pack.sh .carry/gb41d = main with gemv_bulk's deeper ring,
# GemvSmem::Deeper, 48 stages of 4.5 KB; .carry/gb40f = session 40's build with the tensor-core
# dots, BROOK_GEMV_MMA; carry [".carry/gb41d", ".carry/gb40f"]). Tests of the deeper ring
# (cuda_kernels gemv, cuda_e2e's bulk test), stream-floor (tight, deep, deeper per matrix), then
# decode A/B tight, deep (the default), deeper, alternated twice; on an H200 also the
# tensor-core dots off/on.
set -u
mkdir -p /tmp/gb /tmp/mma "$OUT/o5" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb41d/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb40f/gpu-bench.xz > /tmp/mma/gpu-bench && chmod +x /tmp/mma/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o5
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 90 /tmp/gb/cuda_kernels gemv > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -8
timeout 60 /tmp/gb/cuda_e2e bulk_gemv --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
timeout 120 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/sf.json 2> $O/sf.log; echo "stream-floor rc $?"
grep -h "per matrix\|one launch" $O/sf.log | head -30
run() { # variant (tight | deep | deeper | mma0 | mma1), then gpu-bench args
  local t=$1 b=/tmp/gb/gpu-bench smem=$1 mma=0; shift
  case $t in mma*) b=/tmp/mma/gpu-bench; mma=${t#mma}; smem=tight ;; esac
  BROOK_GEMV_SMEM=$smem BROOK_GEMV_MMA=$mma timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for t in tight deep deeper; do
    run $t decode --quick --model llama-2-7b --output-len 256
    run $t decode --quick --model llama-3-8b --output-len 256
    run $t decode --quick --model llama-2-7b --input-len 3800 --output-len 256
  done
done
if grep -q H200 $O/gpu.txt; then
  for r in 1 2; do
    for t in mma0 mma1; do run $t decode --quick --model llama-2-7b --output-len 256; done
  done
fi
cd $OUT && tar czf o5.tgz o5 && rm -rf o5
true
