#!/usr/bin/env bash
# Session 21, call 1: the bulk-copy gemv (kernels/gemv_bulk.cu). Kernel tests (gemv, fp8
# weights, linear), gemv-sweep (the split kernel's builds, the bulk kernel's rings, cuBLAS),
# decode batch 1 with the bulk kernel and without (BROOK_GEMV_BULK, alternated; bf16 and fp8
# weights; Llama-2-7B and Llama-3-8B), then CUDA-vs-CPU.
R=$PWD
tar xJf .carry/s21/new.txz -C /tmp && B=/tmp/s21
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/tests.log
(time timeout 150 ./cuda_kernels gemv fp8_weights gemm --test-threads 2) >> $OUT/tests.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log | head
timeout 120 ./gpu-bench gemv-sweep > $OUT/sweep.jsonl 2> $OUT/sweep.log
grep -E "llama-2-7b.*(s1|bulk|cublas)" $OUT/sweep.log | grep -v "u4\|w16\|w4 " | head -60
for i in 1 2; do for bulk in 1 0; do
  BROOK_GEMV_BULK=$bulk timeout 60 ./gpu-bench decode --quick --model llama-2-7b --output-len 512 >> $OUT/decode.jsonl 2>> $OUT/bench.log
done; done
for q in fp8; do for bulk in 1 0; do
  BROOK_QUANTIZATION=$q BROOK_GEMV_BULK=$bulk timeout 60 ./gpu-bench decode --quick --model llama-2-7b --output-len 512 >> $OUT/decode.jsonl 2>> $OUT/bench.log
done; done
for bulk in 1 0; do
  BROOK_GEMV_BULK=$bulk timeout 60 ./gpu-bench decode --quick --model llama-3-8b --output-len 512 >> $OUT/decode.jsonl 2>> $OUT/bench.log
done
grep "decode batch 1" $OUT/bench.log
(time timeout 100 ./cuda_e2e --test-threads=1) > $OUT/e2e.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/e2e.log | head -3
