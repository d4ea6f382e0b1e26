#!/usr/bin/env bash
# NOT RUN in session 44: every start was refused or held off (BENCHMARKS.md, session 44). The
# code it measures is 923fcf5, reverted by the commit after it. To run it: `git checkout 923fcf5
# -- kernels src tests`, `scripts/gpu-pack.sh .carry/gb44d`; for .carry/gb44c the same with
# kernels/gemv_bulk.cu's row tracking undone (or drop C's runs); .carry/gb44a = gpu-bench built
# at 580b9d3 (any commit with the scalar dots), packed as gpu-pack.sh does.
# Session 44, call 2: call1.sh cut to what decides the tensor-core dots (for a start with little
# device time left): D's gemv kernel tests, stream-floor (scalar dots beside the tensor-core
# ones in one binary), decode batch 1 A/D alternated, and the cuda_e2e tests of the gemv path.
# Packs as call1.sh: carry [".carry/gb44a", ".carry/gb44d"].
set -u
mkdir -p /tmp/ga /tmp/gd "$OUT/o2" || exit 1
xz -dc .carry/gb44a/gpu-bench.xz > /tmp/ga/gpu-bench && chmod +x /tmp/ga/gpu-bench || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb44d/$b.xz > /tmp/gd/$b && chmod +x /tmp/gd/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 100 /tmp/gd/cuda_kernels gemv_bulk gemv_matches gemv_chain > $O/kgemv.log 2>&1; echo "cuda_kernels gemv rc $?"
grep -h "test result\|FAILED\|panicked" $O/kgemv.log | head -6
timeout 45 /tmp/gd/gpu-bench stream-floor --model llama-2-7b > $O/floor.json 2> $O/floor.log; echo "stream-floor rc $?"
grep "gemv\|ring\|matches" $O/floor.log | grep -v "r16\|chain" | head -24
run() { # A|D, gpu-bench args
  local v=$1 d=/tmp/ga; shift; [ $v = D ] && d=/tmp/gd
  timeout 30 $d/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$v | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -2 | tr '\n' ' ')" | tee -a $O/ab.txt
}
for r in 1 2; do
  for v in A D; do
    run $v decode --quick --model llama-2-7b --output-len 256
    [ $r = 1 ] && run $v decode --quick --model llama-3-8b --output-len 256
  done
done
timeout 90 /tmp/gd/cuda_e2e --test-threads 1 bulk_gemv real_model > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
true
