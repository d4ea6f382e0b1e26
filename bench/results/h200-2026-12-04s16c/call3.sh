#!/usr/bin/env bash
# Session 16, call 3: fp8 weights thresholds, the prefill split rule at 3 CTAs an SM, fp8 decode
# variants, 1000/1000 offline with fp8 weights, brook bench through the actors.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s16/new.txz -C /tmp/b
B=/tmp/b/s16
{
echo "== cuda_e2e weights_fp8 (nocapture)"; timeout 150 $B/cuda_e2e --test-threads=1 weights_fp8 --nocapture 2>&1 | grep -v "^ *[0-9]*: \|^ *at " | grep -E "fp8 vs bf16|test result|panicked|FAILED|rror|Agreement|relative" | head -30
echo "== cuda_kernels prefill"; timeout 150 $B/cuda_kernels --test-threads=4 prefill 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_e2e all"; timeout 150 $B/cuda_e2e --test-threads=2 > $OUT/e2e_all.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e_all.txt | head -20
} > $OUT/log.txt 2>&1
{
timeout 60 $B/gpu-bench prefill-chunks --model llama-2-7b
export BROOK_QUANTIZATION=fp8
timeout 120 $B/gpu-bench decode --model llama-2-7b
timeout 150 $B/gpu-bench offline --model llama-2-7b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype fp8
timeout 150 $B/gpu-bench offline --model llama-3-8b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype fp8
unset BROOK_QUANTIZATION
for q in none fp8; do
  for args in "--num-prompts 1 --input-len 128 --output-len 256" "--num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192"; do
    timeout 90 $B/brook bench --synthetic llama-2-7b --device cuda --quantization $q $args --json 2>>$OUT/bench.log | tail -n 1
  done
done
} > $OUT/bench.jsonl 2>> $OUT/bench.log
echo done >> $OUT/log.txt
