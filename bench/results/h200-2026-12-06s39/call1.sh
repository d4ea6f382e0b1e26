#!/usr/bin/env bash
# Session 39, call 1 (binaries: scripts/gpu-pack.sh .carry/gb39a = main a1bbce1 + the
# `gemv_smem` switch, default roomy; carry [".carry/gb39a"]). The bulk gemv launched with only the
# shared memory it uses (BROOK_GEMV_SMEM=tight: ~140 KB, so the O projection's CTAs fit beside
# decode attention's and fill their rings while it runs) against the shipped ~224 KB (roomy),
# alternated; `alternate` (16-stage rings where n <= k, registers for 2 CTAs an SM) once; the
# stream floor with every mode; then the GPU tests of the build (all of cuda_e2e and cuda_kernels).
set -u
mkdir -p /tmp/gb "$OUT/o1" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb39a/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # mode, then gpu-bench args
  local t=$1; shift
  BROOK_GEMV_SMEM=$t timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for L in 128 3800; do
    for t in roomy tight; do run $t decode --quick --model llama-2-7b --input-len $L --output-len 256; done
  done
done
run alternate decode --quick --model llama-2-7b --input-len 128 --output-len 256
timeout 90 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.json 2> $O/floor.log; echo "stream-floor rc $?"
grep "stream floor" $O/floor.log | head -30
for L in 128 3800; do
  for t in roomy tight; do run $t decode --quick --model llama-3-8b --input-len $L --output-len 256; done
done
for a in "--batch 2 --context 4000" "--batch 4 --context 4000"; do
  for t in roomy tight; do run $t decode-batch --model llama-2-7b $a --steps 24; done
done
timeout 100 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
timeout 150 /tmp/gb/cuda_kernels > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -6
cd $OUT && tar czf o1.tgz o1 && rm -rf o1
true
