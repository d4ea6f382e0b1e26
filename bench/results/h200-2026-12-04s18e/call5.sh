#!/usr/bin/env bash
# Session 18, call 5 (commit 3d4e4e1's binaries: Auto now puts any e4m3 cache on the tensor-core
# decode kernel, MHA included): the CUDA-vs-CPU suite, model and WebSocket tests; Llama-2-7B
# (MHA) end to end with the e4m3 cache on tensor cores against the lane kernel
# (BROOK_DECODE_KERNEL=lanes), batch 1 at contexts 128 / 4k / 16k (what attention costs inside
# the step), offline 512 x 128/128 and 300 x 1000/1000, TTFT 2048.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
{
echo "== cuda_e2e (one thread)"; timeout 100 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
echo "== cuda_models"; timeout 60 $B/cuda_models --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_ws"; timeout 60 $B/cuda_ws --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked" | head
} > $OUT/log.txt 2>&1
for len in 128 4096 16384; do
  timeout 40 $B/gpu-bench decode --model llama-2-7b --quick --input-len $len --kv-cache-dtype bf16,fp8 >> $OUT/bench.jsonl 2>> $OUT/bench.log
  BROOK_DECODE_KERNEL=lanes timeout 25 $B/gpu-bench decode --model llama-2-7b --quick --input-len $len --kv-cache-dtype fp8 >> $OUT/lanes.jsonl 2>> $OUT/bench.log
  echo "decode $len rc $?" >> $OUT/log.txt
done
timeout 60 $B/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype bf16,fp8 >> $OUT/bench.jsonl 2>> $OUT/bench.log
BROOK_QUANTIZATION=fp8 timeout 40 $B/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 >> $OUT/bench.jsonl 2>> $OUT/bench.log
BROOK_DECODE_KERNEL=lanes BROOK_QUANTIZATION=fp8 timeout 40 $B/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 >> $OUT/lanes.jsonl 2>> $OUT/bench.log
echo "offline 512 rc $?" >> $OUT/log.txt
for k in auto lanes; do
  BROOK_DECODE_KERNEL=$k timeout 90 $B/gpu-bench offline --model llama-2-7b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype fp8 >> $OUT/offline300_$k.jsonl 2>> $OUT/bench.log
  echo "offline 300 $k rc $?" >> $OUT/log.txt
done
timeout 30 $B/gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/bench.jsonl 2>> $OUT/bench.log
BROOK_QUANTIZATION=fp8 timeout 30 $B/gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/bench.jsonl 2>> $OUT/bench.log
echo "ttft rc $?" >> $OUT/log.txt
gzip -f $OUT/e2e.txt
echo done >> $OUT/log.txt
