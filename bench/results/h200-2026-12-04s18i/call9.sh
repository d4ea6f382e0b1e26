#!/usr/bin/env bash
# Session 18, call 9: call 8's split rule only from 1k keys of context (kernels::
# decode_min_split_keys: 128 keys a split on tensor cores at >= 1024 keys, 32 below, where call 8
# found the step 3 % slower with 128). The decode kernel tests of the split rules and the
# CUDA-vs-CPU suite; batch-1 decode of Llama-3-8B at 128 and 3,800 tokens.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
{
echo "== cuda_kernels paged_decode_filled / fp8_batches"; timeout 60 $B/cuda_kernels --test-threads=8 paged_decode_filled paged_decode_fp8_batches > $OUT/kernels.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head
echo "== cuda_e2e (one thread)"; timeout 60 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
} > $OUT/log.txt 2>&1
for len in 128 3800; do
  timeout 25 $B/gpu-bench decode --model llama-3-8b --quick --input-len $len --kv-cache-dtype bf16,fp8 >> $OUT/decode.jsonl 2>> $OUT/bench.log
done
echo "decode rc $?" >> $OUT/log.txt
gzip -f $OUT/kernels.txt $OUT/e2e.txt
echo done >> $OUT/log.txt
