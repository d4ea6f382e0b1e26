#!/usr/bin/env bash
# Session 37, call 13 (.carry/gb37j: early.xz = gpu-bench with GB_EARLY_LOAD 1 (each consumer
# warp of the bulk gemv takes its first stage into registers before pdl_wait), base.xz = the
# same tree with 0, cuda_kernels of the early build; carry [".carry/gb37j"]).
set -u
mkdir -p /tmp/gb "$OUT/o13" && for b in early base cuda_kernels; do
  xz -dc .carry/gb37j/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o13
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 90 /tmp/gb/cuda_kernels gemv > $O/kernels.log 2>&1; echo "cuda_kernels gemv (early) rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -5
run() { # binary, gpu-bench args
  local b=$1; shift
  timeout 60 /tmp/gb/$b "$@" > $O/d.json 2>> $O/bench.log
  echo "$b | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for b in base early; do
    run $b decode --quick --model llama-2-7b --input-len 128 --output-len 256
    run $b decode --quick --model llama-3-8b --input-len 128 --output-len 256
  done
done
for b in base early; do
  timeout 60 /tmp/gb/$b stream-floor --model llama-2-7b 2> $O/floor-$b.log > /dev/null
  echo "stream-floor $b rc $?"; grep "gemv, one launch\|gemv, per matrix" $O/floor-$b.log | sed 's/ for .* launches,/:/'
done
cd $OUT && tar czf o13.tgz o13 && rm -rf o13
true
