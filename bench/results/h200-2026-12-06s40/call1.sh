#!/usr/bin/env bash
# Session 40, call 1 (binaries: scripts/gpu-pack.sh .carry/gb40f, main after the tensor-core dots moved to their own kernels, gemv_bulk_mma_m1|m2; the
# tensor-core dot in gemv_bulk (`Gpu::gemv_mma`, off by default; BROOK_GEMV_MMA); .carry/gb40a =
# c67f6aa, session 39's stop, as the base; carry [".carry/gb40f", ".carry/gb40a"]).
# The GPU tests (all of cuda_e2e; cuda_kernels' gemv, rope and silu tests
# and the new mma test), `stream-floor --model llama-2-7b` (its
# boundary stamps' first run, the ring with its loads, the mma dots), then decode A/B: base,
# mma off, mma on, at batch 1 (128) and batch 2 (4k), twice.
set -u
mkdir -p /tmp/gb /tmp/base "$OUT/o1" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb40f/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb40a/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 120 /tmp/gb/cuda_kernels gemv rope silu > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -8
for m in llama-2-7b; do
  timeout 100 /tmp/gb/gpu-bench stream-floor --model $m > $O/sf-$m.json 2> $O/sf-$m.log; echo "stream-floor $m rc $?"
  grep -h "stream floor\|boundary\|tail\|gap" $O/sf-$m.log | head -40
done
run() { # variant (base | mma0 | mma1), then gpu-bench args
  local t=$1 b=/tmp/gb/gpu-bench mma=0; shift
  [ $t = base ] && b=/tmp/base/gpu-bench
  [ $t = mma1 ] && mma=1
  BROOK_GEMV_MMA=$mma timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for t in base mma0 mma1; do
    run $t decode --quick --model llama-2-7b --output-len 256
    run $t decode-batch --model llama-2-7b --batch 2 --context 4000 --steps 24
  done
done
timeout 100 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
cd $OUT && tar czf o1.tgz o1 && rm -rf o1
true
