#!/usr/bin/env bash
# Session 21, call 2: why the bulk gemv streams slowly. gemv-sweep with diagnostic builds:
# consumers that hand stages back unread (GB_DIAG 1), and stage i of every CTA side by side in
# memory (GB_DIAG 2); one warp a stage (GB_WARP_STAGES 1) at several rings.
R=$PWD
tar xJf .carry/s21/new.txz -C /tmp && B=/tmp/s21
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
cd $B
timeout 200 ./gpu-bench gemv-sweep > $OUT/sweep.jsonl 2> $OUT/sweep.log
grep -E "llama-2-7b.*(bulk)" $OUT/sweep.log | head -80
