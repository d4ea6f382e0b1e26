#!/usr/bin/env bash
# Session 36, call 8 (.carry/gb36h: gpu-bench with `overlap --green`; carry [".carry/gb36h"]).
# Call 7 failed: cuStreamWriteValue32 refused a pool allocation (INVALID_VALUE); flags now from cuMemAlloc. Call 6: green contexts ran brook's kernels and cuBLAS, but two_streams_green lost (events
# crossing the two green contexts?); this adds two_streams_greenX_values, the hand-offs by
# stream memory operations. Call 5's hog showed attention keeps ~97 % of its speed on 66 of 132 SMs while GEMMs slow in
# proportion: the GPU cut by green contexts (X SMs for GEMMs, the rest for attention), each
# nano-batch's GEMMs on the first partition and its attention on the second.
set -u
P=${P:-.carry/gb36h}
mkdir -p /tmp/gb "$OUT/o8" && xz -dc $P/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o8
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 90 /tmp/gb/gpu-bench overlap --model llama-2-7b --batch 512 --context 192 --green 64 --reps 3 \
  > $O/overlap.jsonl 2> $O/overlap.log; echo "overlap l2 rc $?"
timeout 80 /tmp/gb/gpu-bench overlap --model llama-3-8b --batch 512 --context 1000 --green 64 --reps 3 \
  >> $O/overlap.jsonl 2>> $O/overlap.log; echo "overlap l3 rc $?"
grep -v "allocating" $O/overlap.log | sed 's/, queued.*//' | tail -40
true
