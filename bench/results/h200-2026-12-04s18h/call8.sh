#!/usr/bin/env bash
# Session 18, call 8: the decode split rule on tensor cores with at least 128 keys a split
# (kernels::decode_min_split_keys; 32 before: at batch 1 Llama-3-8B at 4k ran 64 splits of ~60
# keys, two waves of CTAs that each load one 16-key step a warp, and a 64-way merge). The decode
# kernel tests and the CUDA-vs-CPU suite on the new binaries; gpu-bench attention at batch 1 and
# 16 (old rule and new, fill 4 and 6); batch-1 decode at 128 / 3,800 / 7,900 tokens, the previous
# commit's gpu-bench (old) against this one (new).
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
{
echo "== cuda_kernels paged_decode (subset)"; timeout 100 $B/cuda_kernels --test-threads=8 paged_decode_mha paged_decode_gqa paged_decode_inline paged_decode_filled paged_decode_fp8_batches > $OUT/kernels.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head
echo "== cuda_e2e (one thread)"; timeout 100 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
} > $OUT/log.txt 2>&1
timeout 60 $B/gpu-bench attention --decode-only --kv-cache-dtype bf16,fp8 --shapes 32/8/128,28/4/128,32/32/128 --cases 1024/1,4096/1,16384/1,4096/16,16384/16 --variants fill4-inline-mma,fill4-k128-inline-mma,fill6-inline-mma,fill6-k128-inline-mma > $OUT/attention.jsonl 2> $OUT/attention.log
echo "attention rc $?" >> $OUT/log.txt
for g in old new; do
  G=$B/gpu-bench; [ $g = old ] && G=/tmp/b/s18old/gpu-bench
  for len in 128 3800 7900; do
    timeout 30 $G decode --model llama-3-8b --quick --input-len $len --kv-cache-dtype bf16,fp8 >> $OUT/decode_$g.jsonl 2>> $OUT/bench.log
  done
  timeout 30 $G decode --model llama-2-7b --quick --input-len 3800 --kv-cache-dtype fp8 >> $OUT/decode_$g.jsonl 2>> $OUT/bench.log
  echo "decode $g rc $?" >> $OUT/log.txt
done
gzip -f $OUT/kernels.txt $OUT/e2e.txt
echo done >> $OUT/log.txt
