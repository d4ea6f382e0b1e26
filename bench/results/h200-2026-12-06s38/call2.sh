#!/usr/bin/env bash
# Session 38, call 2 (binaries .carry/gb38b: call 1's tree, the fused kernel now under the
# breakdown's "linear" switch; carry [".carry/gb38b"]): call 1's kernel tests faulted (an illegal
# address, every later test in the process failing with it). Each test alone, the fused one under
# compute-sanitizer; then where the fused step's time goes (decode-batch --breakdown, off / late).
set -u
mkdir -p /tmp/gb "$OUT/o2" || exit 1
for b in gpu-bench cuda_kernels; do
  xz -dc .carry/gb38b/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for t in gemv::gemv_bulk_matches_reference gemv_bulk_rope_adds gemv_bulk_rope_projects gemv_bulk_rope_ranges gemv_bulk_rope_writes; do
  timeout 60 /tmp/gb/cuda_kernels $t --test-threads 1 > $O/k_$t.log 2>&1; echo "cuda_kernels $t rc $?"
  grep -h "panicked\|Err\|assert" $O/k_$t.log | head -3
done
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 4 /tmp/gb/cuda_kernels gemv_bulk_rope_projects --test-threads 1 > $O/sanitizer.log 2>&1
echo "sanitizer rc $?"; grep -m12 -E "Invalid|at 0x|by thread|Address|ERROR SUMMARY|kernel|test result" $O/sanitizer.log
for q in 0 2; do
  BROOK_QKV_ROPE=$q timeout 120 /tmp/gb/gpu-bench decode-batch --model llama-2-7b --batch 1 --context 128 --steps 64 --breakdown > $O/bd$q.json 2> $O/bd$q.log
  echo "breakdown qkv_rope=$q rc $?"; grep -i "left out\|skip\|ms" $O/bd$q.log | tail -12
done
cd $OUT && tar czf o2.tgz o2 && rm -rf o2
true
