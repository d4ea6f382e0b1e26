#!/usr/bin/env bash
# Session 18, call 7: decode attention launched with PDL (its CTAs resident while rope_kv, which
# now triggers at its start, finishes; both decode kernels wait in decode_cta before reading q
# and K/V). The decode kernel tests and the CUDA-vs-CPU suite on the new binaries, then batch-1
# decode at 128 / 3,800 / 7,900 tokens, commit 3d4e4e1's gpu-bench (old) against this one (new),
# alternated; offline Llama-3-8B 300 x 1000/1000 fp8 + fp8 old against new.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
{
echo "== cuda_kernels paged_decode/rope (subset)"; timeout 120 $B/cuda_kernels --test-threads=8 paged_decode_mha paged_decode_gqa paged_decode_inline paged_decode_fp8_batches rope > $OUT/kernels.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head
echo "== cuda_e2e (one thread)"; timeout 100 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
} > $OUT/log.txt 2>&1
for g in old new; do
  G=$B/gpu-bench; [ $g = old ] && G=/tmp/b/s18old/gpu-bench
  for len in 128 3800; do
    timeout 30 $G decode --model llama-2-7b --quick --input-len $len --kv-cache-dtype bf16,fp8 >> $OUT/decode_$g.jsonl 2>> $OUT/bench.log
  done
  for len in 128 3800 7900; do
    timeout 30 $G decode --model llama-3-8b --quick --input-len $len --kv-cache-dtype bf16,fp8 >> $OUT/decode_$g.jsonl 2>> $OUT/bench.log
  done
  echo "decode $g rc $?" >> $OUT/log.txt
done
for g in old new; do
  G=$B/gpu-bench; [ $g = old ] && G=/tmp/b/s18old/gpu-bench
  BROOK_QUANTIZATION=fp8 timeout 60 $G offline --model llama-3-8b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype fp8 >> $OUT/offline_$g.jsonl 2>> $OUT/bench.log
  echo "offline $g rc $?" >> $OUT/log.txt
done
gzip -f $OUT/kernels.txt $OUT/e2e.txt
echo done >> $OUT/log.txt
