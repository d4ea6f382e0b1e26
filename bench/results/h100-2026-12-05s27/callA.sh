#!/usr/bin/env bash
# Session 27, call A (carry [".carry/gb27"], packed by pack.sh at this commit): the GPU tests that changed.
# cuda_kernels (with the embedding kernel's vocabulary slice, session 25's trace and
# gemm_adds_into_f32_output), cuda_e2e's tensor-parallel tests `tp::` (verbose), then a subset
# of cuda_e2e (below).
mkdir -p /tmp/gb && for b in cuda_kernels cuda_e2e; do
  xz -dc .carry/gb27/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version --format=csv
timeout 150 /tmp/gb/cuda_kernels --test-threads 1 >"$OUT/cuda_kernels.log" 2>&1; echo "cuda_kernels rc $?"
grep -E "test result|FAILED|panicked" "$OUT/cuda_kernels.log" | head
timeout 200 /tmp/gb/cuda_e2e tp:: --test-threads 1 --nocapture >"$OUT/cuda_e2e_tp.log" 2>&1; echo "cuda_e2e tp rc $?"
grep -E "^test |test result|FAILED|panicked|tensor parallel|tokens as on one rank" "$OUT/cuda_e2e_tp.log" | head -40
# Beside them, what changed for one GPU since session 24's full run (33/33): the embedding's
# vocabulary bounds (every model: the serving path), session 25's residual_gemm and warm-up
# tests, the streamed load.
timeout 200 /tmp/gb/cuda_e2e persistent:: residual_gemm warm_up streamed_bf16 cuda_matches_cpu_gqa_hd64 --test-threads 1 >"$OUT/cuda_e2e.log" 2>&1; echo "cuda_e2e rc $?"
grep -E "test result|FAILED|panicked" "$OUT/cuda_e2e.log" | head
