#!/usr/bin/env bash
# Session 19, call 1: the wgmma prefill kernel's tests, prefill-chunks (wgmma vs mma.sync), TTFT A/B.
R=$PWD
tar xJf .carry/s19/new.txz -C /tmp && B=/tmp/s19
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
(time timeout 150 ./cuda_kernels prefill --test-threads 2) > $OUT/tests.log 2>&1
tail -5 $OUT/tests.log
timeout 150 ./gpu-bench prefill-chunks --model llama-2-7b,llama-3-8b > $OUT/chunks.jsonl 2> $OUT/chunks.log
tail -30 $OUT/chunks.log | cut -c1-250
for i in 1 2; do for w in 1 0; do
  BROOK_PREFILL_WGMMA=$w timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/ttft.jsonl 2>> $OUT/ttft.log
done; done
grep -h ttft $OUT/ttft.jsonl | cut -c1-300
