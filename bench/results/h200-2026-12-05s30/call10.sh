#!/usr/bin/env bash
# Session 30, call 10 (carry [".carry/gb30d"]: this commit's cuda_kernels and cuda_e2e): the
# step-pipeline kernel tests (copy_out's new one included), then the whole CUDA-vs-CPU suite on
# one test thread.
mkdir -p /tmp/gb /tmp/o10 && for b in cuda_kernels cuda_e2e; do xz -dc .carry/gb30d/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=/tmp/o10
trap 'tar czf "$OUT/call10.tgz" -C /tmp o10' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
timeout 60 /tmp/gb/cuda_kernels step_io > $O/kernels.log 2>&1; echo "cuda_kernels step_io rc $?: $(grep 'test result' $O/kernels.log)"
timeout 290 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?: $(grep 'test result' $O/e2e.log)"
grep -E "FAILED|panicked|^test .*\.\.\. [a-z]" $O/e2e.log | grep -v " ok$" | head -10
