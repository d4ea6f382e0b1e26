#!/usr/bin/env bash
# Session 29, call 5 (carry [".carry/gb29"], packed by pack.sh at e630f87: the gate|up buffer
# allocated at bf16 size when gate_up_bf16): cuda_e2e on one thread, the demo model included.
mkdir -p /tmp/gb && xz -dc .carry/gb29/cuda_e2e.xz > /tmp/gb/cuda_e2e && chmod +x /tmp/gb/cuda_e2e
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1 BROOK_E2E_MODEL=$PWD/models/demo-chat
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 130 /tmp/gb/cuda_e2e --test-threads 1 --nocapture > $OUT/cuda_e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -E "test result|FAILED|panicked|demo-chat: eager" -A1 $OUT/cuda_e2e.log | head -12
