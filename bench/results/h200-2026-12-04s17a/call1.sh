#!/usr/bin/env bash
# Session 17, call 1: the tensor-core decode kernel (paged_decode_mma.cu): the decode attention
# kernel tests on both kernels, then gpu-bench attention --decode-only (every shape, both cache
# dtypes, lane and mma variants), then the whole kernel suite.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s17/new.txz -C /tmp/b
B=/tmp/b/s17
{
echo "== cuda_kernels paged_decode"; timeout 150 $B/cuda_kernels --test-threads=1 paged_decode 2>&1 | grep -E "^test |test result|panicked" | head -40
} > $OUT/log.txt 2>&1
timeout 240 $B/gpu-bench attention --decode-only --kv-cache-dtype bf16,fp8 > $OUT/attention.jsonl 2> $OUT/attention.log
echo "attention rc $?" >> $OUT/log.txt
{
echo "== cuda_kernels (all)"; timeout 150 $B/cuda_kernels --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked" | head -20
} >> $OUT/log.txt 2>&1
echo done >> $OUT/log.txt
