#!/usr/bin/env bash
# Session 21, call 5: the bulk gemv with 16 consumer warps (call 4: on par with the split
# kernel alone). Does its ring, filled before pdl_wait, gain inside the decode graph? Kernel
# tests, decode batch 1 A/B (BROOK_GEMV_BULK, alternated; bf16, fp8; Llama-2-7B, Llama-3-8B).
R=$PWD
tar xJf .carry/s21/new.txz -C /tmp && B=/tmp/s21
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
cd $B
(time timeout 150 ./cuda_kernels gemv fp8_weights gemm --test-threads 2) > $OUT/tests.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log | head
for i in 1 2; do for bulk in 1 0; do
  BROOK_GEMV_BULK=$bulk timeout 60 ./gpu-bench decode --quick --model llama-2-7b --output-len 512 >> $OUT/decode.jsonl 2>> $OUT/bench.log
done; done
for bulk in 1 0; do
  BROOK_QUANTIZATION=fp8 BROOK_GEMV_BULK=$bulk timeout 60 ./gpu-bench decode --quick --model llama-2-7b --output-len 512 >> $OUT/decode.jsonl 2>> $OUT/bench.log
  BROOK_GEMV_BULK=$bulk timeout 60 ./gpu-bench decode --quick --model llama-3-8b --output-len 512 >> $OUT/decode.jsonl 2>> $OUT/bench.log
done
grep "decode batch 1" $OUT/bench.log
timeout 100 ./gpu-bench gemv-sweep > $OUT/sweep.jsonl 2> $OUT/sweep.log
grep -E "(llama-2-7b|llama-3-8b).*(bulk)" $OUT/sweep.log | grep -v "lm_head\|llama-3-8b o\|llama-3-8b gate" | head -40
