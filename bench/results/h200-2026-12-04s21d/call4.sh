#!/usr/bin/env bash
# Session 21, call 4: the bulk gemv's consumers are latency-bound (call 3: the ring alone streams
# at 4.0-4.5 TB/s, with the dot products 1.7-3.6). gemv-sweep over more consumer warps a CTA.
R=$PWD
tar xJf .carry/s21/new.txz -C /tmp && B=/tmp/s21
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
cd $B
timeout 200 ./gpu-bench gemv-sweep > $OUT/sweep.jsonl 2> $OUT/sweep.log
grep -E "(llama-2-7b|llama-3-8b).*(w8 u2 s1|bulk)" $OUT/sweep.log | grep -v "lm_head\|llama-3-8b o\|llama-3-8b gate" | head -90
grep -v "^gemv" $OUT/sweep.log | head -5
