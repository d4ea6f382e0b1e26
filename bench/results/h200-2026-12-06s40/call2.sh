#!/usr/bin/env bash
# Session 40, call 2 (binaries: scripts/gpu-pack.sh .carry/gb40h = 7af147b, main with gemv_bulk's x staged
# GB_X_LOADS (4) loads a thread before its stores; .carry/gb40f = call 1's build, the base;
# carry [".carry/gb40h", ".carry/gb40f"]). Tests of the new build (cuda_kernels gemv, all of
# cuda_e2e), stream-floor's stamps (x), then decode A/B base against new, alternated twice.
set -u
mkdir -p /tmp/gb /tmp/base "$OUT/o2" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb40h/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb40f/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 60 /tmp/gb/cuda_kernels gemv > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -8
timeout 100 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/sf.json 2> $O/sf.log; echo "stream-floor rc $?"
grep -h "per matrix (PDL)\|stamps\|into " $O/sf.log | head -24
run() { # variant (base | new), then gpu-bench args
  local t=$1 b=/tmp/gb/gpu-bench; shift
  [ $t = base ] && b=/tmp/base/gpu-bench
  timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for t in base new; do
    run $t decode --quick --model llama-2-7b --output-len 256
    run $t decode --quick --model llama-3-8b --output-len 256
    run $t decode --quick --model llama-2-7b --input-len 3800 --output-len 256
    run $t decode-batch --model llama-2-7b --batch 2 --context 4000 --steps 24
  done
done
timeout 100 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
cd $OUT && tar czf o2.tgz o2 && rm -rf o2
true
