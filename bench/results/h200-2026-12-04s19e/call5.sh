#!/usr/bin/env bash
# Session 19, call 5 (binaries of bcbbd19): the CUDA model and WebSocket tests, then the llama.cpp
# side-by-side kit (llama.cpp built on the machine, random Llama-2-7B F16 GGUF; brook's gpu-bench
# and brook bench on --synthetic llama-2-7b), all in one call.
R=$PWD; B=$R/.carry/cuda
mkdir -p $R/.carry && tar xJf .carry/s19/cuda.txz -C $R/.carry
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
(time timeout 100 $B/cuda_models --test-threads=1) > $OUT/models.log 2>&1
(time timeout 80 $B/cuda_ws --test-threads=1) > $OUT/ws.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/models.log $OUT/ws.log | head
OUT=/tmp/sbs-out bash bench/peers/side_by_side.sh --build-llama --budget 440 > $OUT/sbs.out 2>&1
tail -45 $OUT/sbs.out
rm -f /tmp/sbs-out/llamacpp/*.gguf; tar czf $OUT/sbs-out.tgz -C /tmp sbs-out
