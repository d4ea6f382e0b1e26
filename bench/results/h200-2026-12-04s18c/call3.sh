#!/usr/bin/env bash
# Session 18, call 3: paged_decode_mma2 after call 2's profile (its loads waited on each
# other's registers: one block-table read and one address a 16-key step now, every load
# unconditional). The decode kernel tests (all four kernels, block sizes 1-64), gpu-bench
# attention on the GQA shapes (bf16, e4m3), and decode-batch on each tensor-core kernel:
# Llama-3-8B fp8 weights + fp8 KV at batch 1000 x 1,500 tokens, bf16 + bf16 at 512 x 1,500.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
{
echo "== cuda_kernels paged_decode (subset)"; timeout 150 $B/cuda_kernels --test-threads=8 paged_decode_mha paged_decode_gqa paged_decode_sliding paged_decode_inline paged_decode_filled paged_decode_fp8_batches paged_decode_block_sizes > $OUT/kernels.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head -20
} > $OUT/log.txt 2>&1
timeout 120 $B/gpu-bench attention --decode-only --kv-cache-dtype bf16,fp8 --shapes 32/8/128,28/4/128 --variants fill8-inline,fill4-inline-mma,fill4-inline-mma2,fill4-inline-mma3,fill6-inline-mma3 > $OUT/attention.jsonl 2> $OUT/attention.log
echo "attention rc $?" >> $OUT/log.txt
for k in mma mma2 mma3; do
  BROOK_QUANTIZATION=fp8 BROOK_DECODE_KERNEL=$k timeout 40 $B/gpu-bench decode-batch --model llama-3-8b --batch 1000 --context 1500 --kv-cache-dtype fp8 >> $OUT/batch.jsonl 2>> $OUT/bench.log
  echo "decode-batch fp8 $k rc $?" >> $OUT/log.txt
  BROOK_DECODE_KERNEL=$k timeout 40 $B/gpu-bench decode-batch --model llama-3-8b --batch 512 --context 1500 --kv-cache-dtype bf16 >> $OUT/batch.jsonl 2>> $OUT/bench.log
  echo "decode-batch bf16 $k rc $?" >> $OUT/log.txt
done
gzip -f $OUT/kernels.txt
echo done >> $OUT/log.txt
