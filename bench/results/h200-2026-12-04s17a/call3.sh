#!/usr/bin/env bash
# Session 17, call 3: P kept as hi + lo bf16 in the bf16 tensor-core decode (call 2's CUDA-vs-CPU
# error and swap test): the decode kernel tests, the CUDA-vs-CPU suite, gpu-bench attention
# again, then Llama-3-8B offline 300 x 1000/1000 on bf16 weights and cache, lanes vs default.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s17/new.txz -C /tmp/b
B=/tmp/b/s17
{
echo "== cuda_e2e (one thread)"; timeout 200 $B/cuda_e2e --test-threads=1 --nocapture > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
echo "== cuda_kernels paged_decode"; timeout 200 $B/cuda_kernels --test-threads=2 paged_decode 2>&1 | grep -E "test result|FAILED|panicked" | head
} > $OUT/log.txt 2>&1
timeout 200 $B/gpu-bench attention --decode-only --kv-cache-dtype bf16 > $OUT/attention.jsonl 2> $OUT/attention.log
echo "attention rc $?" >> $OUT/log.txt
for k in lanes auto; do
  BROOK_DECODE_KERNEL=$k timeout 100 $B/gpu-bench offline --model llama-3-8b --num-prompts 300 --input-len 1000 --output-len 1000 >> $OUT/bench.jsonl 2>> $OUT/bench.log
  echo "offline bf16 $k rc $?" >> $OUT/log.txt
done
echo done >> $OUT/log.txt
