#!/usr/bin/env bash
# Session 37, call 14 (binaries: scripts/gpu-pack.sh .carry/gb37k at 774aafd, the stop's code;
# carry [".carry/gb37k"]): the GPU tests on the final build, and batch-1 decode once.
set -u
P=${P:-.carry/gb37k}
mkdir -p /tmp/gb "$OUT/o14" && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o14
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 100 /tmp/gb/cuda_kernels rope_kv sample silu gemv > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -5
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -8
timeout 40 /tmp/gb/gpu-bench decode --quick --model llama-2-7b --output-len 256 > $O/d.json 2> $O/bench.log
echo "decode rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)"
cd $OUT && tar czf o14.tgz o14 && rm -rf o14
true
