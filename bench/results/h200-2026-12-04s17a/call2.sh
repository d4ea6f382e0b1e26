#!/usr/bin/env bash
# Session 17, call 2: the Auto rule (tensor-core decode for GQA) through the whole engine: the
# CUDA-vs-CPU suite and the model goldens, then Llama-3-8B offline 300 x 1000/1000 (fp8 weights,
# fp8 KV) with the lane kernel against the default (tensor cores), alternated.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s17/new.txz -C /tmp/b
B=/tmp/b/s17
{
echo "== cuda_kernels paged_decode"; timeout 100 $B/cuda_kernels --test-threads=1 paged_decode 2>&1 | grep -E "test result|FAILED|panicked" | head
echo "== cuda_e2e (one thread)"; timeout 200 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
echo "== cuda_models"; timeout 60 $B/cuda_models --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked" | head
} > $OUT/log.txt 2>&1
export BROOK_QUANTIZATION=fp8
for k in lanes auto lanes auto; do
  BROOK_DECODE_KERNEL=$k timeout 100 $B/gpu-bench offline --model llama-3-8b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype fp8 >> $OUT/bench.jsonl 2>> $OUT/bench.log
  echo "offline $k rc $?" >> $OUT/log.txt
done
echo done >> $OUT/log.txt
