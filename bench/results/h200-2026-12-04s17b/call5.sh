#!/usr/bin/env bash
# Session 17, call 5: block-table lookups by shift and mask in both decode kernels (no integer
# division per key), and the tensor-core kernel's rescale only when a row's max rises. The
# decode kernel tests (both kernels), the CUDA-vs-CPU suite, gpu-bench attention (e4m3 cache),
# then Llama-3-8B offline 300 x 1000/1000 (fp8 weights, fp8 KV): commit 125f32d (old) against
# this one, alternated.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s17/new.txz -C /tmp/b && tar xJf .carry/s17/old.txz -C /tmp/b
B=/tmp/b/s17
{
echo "== cuda_kernels paged_decode (subset)"; timeout 120 $B/cuda_kernels --test-threads=2 paged_decode_mha paged_decode_gqa paged_decode_sliding paged_decode_inline paged_decode_filled paged_decode_fp8_batches 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_e2e (one thread)"; timeout 100 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
} > $OUT/log.txt 2>&1
timeout 100 $B/gpu-bench attention --decode-only --kv-cache-dtype fp8 > $OUT/attention.jsonl 2> $OUT/attention.log
echo "attention rc $?" >> $OUT/log.txt
export BROOK_QUANTIZATION=fp8
for g in old new; do
  G=$B/gpu-bench; [ $g = old ] && G=/tmp/b/s17old/gpu-bench
  timeout 80 $G offline --model llama-3-8b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype fp8 > $OUT/offline_$g.jsonl 2>> $OUT/bench.log
  echo "offline $g rc $?" >> $OUT/log.txt
done
echo done >> $OUT/log.txt
