#!/usr/bin/env bash
# Session 18, call 6 (commit 3d4e4e1's gpu-bench): batch-1 decode at contexts inside each model's
# window (call 5 asked Llama-2-7B for 4k + 256 and 16k, past its 4,096 positions): what decode
# attention costs inside the step (CUDA graphs, PDL) is the step's growth with the context.
# Llama-2-7B at 128 and 3,800 tokens, Llama-3-8B at 128, 3,800 and 7,900; bf16 and e4m3 caches;
# Llama-2-7B's e4m3 also on the lane kernel.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
: > $OUT/log.txt
for len in 128 3800; do
  timeout 30 $B/gpu-bench decode --model llama-2-7b --quick --input-len $len --kv-cache-dtype bf16,fp8 >> $OUT/bench.jsonl 2>> $OUT/bench.log
  BROOK_DECODE_KERNEL=lanes timeout 20 $B/gpu-bench decode --model llama-2-7b --quick --input-len $len --kv-cache-dtype fp8 >> $OUT/lanes.jsonl 2>> $OUT/bench.log
  echo "llama-2-7b $len rc $?" >> $OUT/log.txt
done
for len in 128 3800 7900; do
  timeout 30 $B/gpu-bench decode --model llama-3-8b --quick --input-len $len --kv-cache-dtype bf16,fp8 >> $OUT/bench.jsonl 2>> $OUT/bench.log
  echo "llama-3-8b $len rc $?" >> $OUT/log.txt
done
echo done >> $OUT/log.txt
