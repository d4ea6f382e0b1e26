#!/usr/bin/env bash
# Session 17, call 4: Llama-3-8B 1000 x 1000/1000 (fp8 weights, fp8 KV, up to 1024 sequences a
# step) on the default decode kernel (tensor cores for GQA), beside session 16's 9,081 tok/s on
# the lane kernel and TensorRT-LLM's published figure; then decode batch 1, lanes vs default.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s17/new.txz -C /tmp/b
B=/tmp/b/s17
BROOK_QUANTIZATION=fp8 timeout 300 $B/gpu-bench offline --model llama-3-8b --num-prompts 1000 --input-len 1000 --output-len 1000 --max-num-seqs 1024 --kv-cache-dtype fp8 > $OUT/bench.jsonl 2> $OUT/bench.log
echo "offline 1000 rc $?" >> $OUT/log.txt
for k in lanes auto; do
  BROOK_DECODE_KERNEL=$k timeout 60 $B/gpu-bench decode --model llama-3-8b --quick >> $OUT/bench.jsonl 2>> $OUT/bench.log
  echo "decode $k rc $?" >> $OUT/log.txt
done
