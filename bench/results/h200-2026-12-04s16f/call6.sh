#!/usr/bin/env bash
# Session 16, call 6: Llama-3-8B with fp8 weights and fp8 KV at 1000 x 1000/1000 and up to 1024
# sequences a step (beside TensorRT-LLM's 3,000-request FP8 figure).
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s16/new.txz -C /tmp/b
BROOK_QUANTIZATION=fp8 timeout 420 /tmp/b/s16/gpu-bench offline --model llama-3-8b --num-prompts 1000 --input-len 1000 --output-len 1000 --max-num-seqs 1024 --kv-cache-dtype fp8 > $OUT/bench.jsonl 2> $OUT/bench.log
echo "rc $?" >> $OUT/bench.log
