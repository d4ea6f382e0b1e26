#!/usr/bin/env bash
# Session 18, call 4: the tensor-core decode kernel rewritten (heads as the mma's columns; one
# block-table read a 16-key step; bf16 at 2 CTAs an SM, e4m3 at 3) in place of session 17's.
# Every paged_decode kernel test, the CUDA-vs-CPU suite (one thread), the model tests;
# gpu-bench attention on all four default shapes (lanes, tensor cores at fill 4 and 6);
# decode-batch (Llama-3-8B, fp8 + fp8 at 1000 x 1,500, bf16 + bf16 at 512 x 1,500); offline
# Llama-3-8B 1000 x 1000/1000 fp8 + fp8 and 300 x 1000/1000 bf16 + bf16; decode batch 1.
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
{
echo "== cuda_kernels paged_decode (all)"; timeout 200 $B/cuda_kernels --test-threads=8 paged_decode > $OUT/kernels.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head -20
echo "== cuda_e2e (one thread)"; timeout 100 $B/cuda_e2e --test-threads=1 > $OUT/e2e.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/e2e.txt | head -20
echo "== cuda_models"; timeout 60 $B/cuda_models --test-threads=1 > $OUT/models.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/models.txt | head
} > $OUT/log.txt 2>&1
timeout 100 $B/gpu-bench attention --decode-only --kv-cache-dtype bf16,fp8 --variants fill8-inline,fill4-inline-mma,fill6-inline-mma > $OUT/attention.jsonl 2> $OUT/attention.log
echo "attention rc $?" >> $OUT/log.txt
BROOK_QUANTIZATION=fp8 timeout 30 $B/gpu-bench decode-batch --model llama-3-8b --batch 1000 --context 1500 --kv-cache-dtype fp8 >> $OUT/bench.jsonl 2>> $OUT/bench.log
timeout 30 $B/gpu-bench decode-batch --model llama-3-8b --batch 512 --context 1500 --kv-cache-dtype bf16 >> $OUT/bench.jsonl 2>> $OUT/bench.log
BROOK_QUANTIZATION=fp8 timeout 100 $B/gpu-bench offline --model llama-3-8b --num-prompts 1000 --input-len 1000 --output-len 1000 --max-num-seqs 1024 --kv-cache-dtype fp8 >> $OUT/bench.jsonl 2>> $OUT/bench.log
echo "offline 1000 rc $?" >> $OUT/log.txt
timeout 60 $B/gpu-bench offline --model llama-3-8b --num-prompts 300 --input-len 1000 --output-len 1000 --kv-cache-dtype bf16 >> $OUT/bench.jsonl 2>> $OUT/bench.log
echo "offline 300 bf16 rc $?" >> $OUT/log.txt
timeout 30 $B/gpu-bench decode --model llama-3-8b --quick >> $OUT/bench.jsonl 2>> $OUT/bench.log
echo "decode b1 rc $?" >> $OUT/log.txt
gzip -f $OUT/kernels.txt $OUT/e2e.txt $OUT/attention.log
echo done >> $OUT/log.txt
