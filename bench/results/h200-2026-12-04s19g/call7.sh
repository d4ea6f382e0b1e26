#!/usr/bin/env bash
# Session 19, call 7 (binaries of main after call 6): every cuda_kernels test but the long paged
# decode sweeps (the launch path now passes dynamic shared memory), cuda_models, cuda_ws.
R=$PWD
tar xJf .carry/s19/new.txz -C /tmp && B=/tmp/s19
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 60 ./cuda_models --test-threads=1) > $OUT/models.log 2>&1
(time timeout 40 ./cuda_ws --test-threads=1) > $OUT/ws.log 2>&1
(time timeout 200 ./cuda_kernels --test-threads=8 --skip paged_decode) > $OUT/kernels.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/models.log $OUT/ws.log $OUT/kernels.log | head -20
