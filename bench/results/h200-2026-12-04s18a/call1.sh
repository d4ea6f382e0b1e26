#!/usr/bin/env bash
# Session 18, call 1: the tensor-core decode kernel with the heads as the mma's columns
# (paged_decode_mma2.cu: mma2 at 2 CTAs an SM, mma3 at 3) against paged_decode_mma.cu: the
# decode kernel tests on all four kernels (block sizes 1-64 too), the CUDA-vs-CPU suite on the
# current main's defaults, gpu-bench attention (bf16 and e4m3), and gpu-bench decode-batch
# (Llama-3-8B, fp8 weights and KV, batch 1000 at 1,500 tokens): each decode kernel, then the
# default with each kind of launch left out.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
{
echo "== cuda_kernels paged_decode (subset)"; timeout 150 $B/cuda_kernels --test-threads=4 paged_decode_mha paged_decode_gqa paged_decode_sliding paged_decode_inline paged_decode_filled paged_decode_fp8_batches paged_decode_block_sizes > $OUT/kernels.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head -20
echo "== cuda_e2e (one thread)"; timeout 110 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
} > $OUT/log.txt 2>&1
timeout 150 $B/gpu-bench attention --decode-only --kv-cache-dtype bf16,fp8 --shapes 32/8/128,28/4/128,32/32/128 > $OUT/attention.jsonl 2> $OUT/attention.log
echo "attention rc $?" >> $OUT/log.txt
export BROOK_QUANTIZATION=fp8
for k in mma mma2 mma3 lanes; do
  BROOK_DECODE_KERNEL=$k timeout 40 $B/gpu-bench decode-batch --model llama-3-8b --batch 1000 --context 1500 --kv-cache-dtype fp8 >> $OUT/batch.jsonl 2>> $OUT/bench.log
  echo "decode-batch $k rc $?" >> $OUT/log.txt
done
timeout 120 $B/gpu-bench decode-batch --model llama-3-8b --batch 1000 --context 1500 --kv-cache-dtype fp8 --breakdown >> $OUT/batch.jsonl 2>> $OUT/bench.log
echo "breakdown rc $?" >> $OUT/log.txt
gzip -f $OUT/attention.log $OUT/e2e.txt $OUT/kernels.txt
echo done >> $OUT/log.txt
