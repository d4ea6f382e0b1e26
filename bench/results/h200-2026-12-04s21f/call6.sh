#!/usr/bin/env bash
# Session 21, call 6: the bulk gemv with x staged in shared memory (GB_X_SMEM): are the
# consumers' x loads what keeps it ~4.5 us a launch behind its ring alone? gemv-sweep.
R=$PWD
tar xJf .carry/s21/new.txz -C /tmp && B=/tmp/s21
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
cd $B
timeout 200 ./gpu-bench gemv-sweep > $OUT/sweep.jsonl 2> $OUT/sweep.log
grep -E "(llama-2-7b|llama-3-8b).*(bulk)" $OUT/sweep.log | grep -v "llama-3-8b o\|llama-3-8b gate" | head -60
grep -v "^gemv" $OUT/sweep.log | head -5
