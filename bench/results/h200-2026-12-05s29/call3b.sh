#!/usr/bin/env bash
# Session 29, after call 3 on the same warm H100 (call 3 ran cuda_e2e on parallel test threads,
# where one test's graph capture is invalidated by another's allocations: 7 failures that are
# not the code's): cuda_e2e on one thread, then the demo-model tests with BROOK_E2E_MODEL set.
# After call 4 the same two ran on its warm H200 (call4/cuda_e2e_h200.log).
mkdir -p /tmp/gb && xz -dc .carry/gb29/cuda_e2e.xz > /tmp/gb/cuda_e2e && chmod +x /tmp/gb/cuda_e2e
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
timeout 230 /tmp/gb/cuda_e2e --test-threads 1 > $OUT/cuda_e2e.log 2>&1; echo "cuda_e2e rc $?"
BROOK_E2E_MODEL=$PWD/models/demo-chat timeout 120 /tmp/gb/cuda_e2e --test-threads 1 --nocapture real_model demo_model > $OUT/real_model.log 2>&1; echo "rc $?"
