#!/usr/bin/env bash
# Session 43, call 4 (run after call3.sh in the same device call; carry [".carry/gb43c",
# ".carry/gb43d"]). gb43d = gb43c + the bulk gemv's consumers taking a whole stage inside one
# row without a bounds test and a row choice a step (same sums, same order). A = gb43c,
# B = gb43d: stream-floor of each, then decode batch 1 alternated twice; then B's gemv kernel
# tests and cuda_e2e's bulk-gemv and demo-model tests.
set -u
mkdir -p /tmp/ga /tmp/gbb "$OUT/o4" || exit 1
for b in gpu-bench; do
  xz -dc .carry/gb43c/$b.xz > /tmp/ga/$b && chmod +x /tmp/ga/$b || exit 1
done
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb43d/$b.xz > /tmp/gbb/$b && chmod +x /tmp/gbb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for v in A B; do
  d=/tmp/ga; [ $v = B ] && d=/tmp/gbb
  timeout 60 $d/gpu-bench stream-floor --model llama-2-7b > $O/floor_$v.json 2> $O/floor_$v.log; echo "stream-floor $v rc $?"
  grep "gemv\|ring" $O/floor_$v.log | grep -v "r16\|chain" | sed "s/^/$v /"
done
run() { # A|B, gpu-bench args
  local v=$1 d=/tmp/ga; shift; [ $v = B ] && d=/tmp/gbb
  timeout 60 $d/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$v | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for v in A B; do
    run $v decode --quick --model llama-2-7b --output-len 256
    run $v decode --quick --model llama-3-8b --output-len 256
    run $v decode-batch --model llama-3-8b --batch 4 --context 4000 --steps 24
  done
done
timeout 120 /tmp/gbb/cuda_kernels gemv > $O/kernels.log 2>&1; echo "cuda_kernels gemv rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -5
timeout 120 /tmp/gbb/cuda_e2e --test-threads 1 bulk_gemv real_model > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -5
true
