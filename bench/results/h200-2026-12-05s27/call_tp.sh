#!/usr/bin/env bash
# Session 27: tensor parallelism on the CUDA executor (ranks on one GPU, host-staged
# collectives) and the embedding kernel's vocabulary slice; binaries packed by pack.sh into
# .carry/gb27 (carry [".carry/gb27"]; ~3 min).
mkdir -p /tmp/gb && for b in cuda_kernels cuda_e2e; do
  xz -dc .carry/gb27/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout 120 /tmp/gb/cuda_kernels embedding --test-threads 1 >"$OUT/kernels_embedding.log" 2>&1; echo "embedding rc $?"
grep -E "test result|FAILED|panicked" "$OUT/kernels_embedding.log" | head
timeout 400 /tmp/gb/cuda_e2e tp:: --test-threads 1 --nocapture >"$OUT/cuda_e2e_tp.log" 2>&1; echo "tp rc $?"
grep -E "^test |test result|FAILED|panicked|tensor parallel|tokens as on one rank" "$OUT/cuda_e2e_tp.log" | head -40
