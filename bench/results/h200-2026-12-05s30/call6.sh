#!/usr/bin/env bash
# Session 30, call 6 (carry [".carry/gb30"]): is it the pinned upload? gpu-bench-x is 2b50d42's
# gpu-bench with one experimental line in PinnedIo::upload (not committed): with
# BROOK_X_PAGEABLE_UP set, the step's metadata goes up by the pageable copy (Gpu::upload) even
# under pinned I/O; the outputs still come back through the pinned stages. Batch 1 at 128 tokens,
# default / pinned / lookahead, without and with it, alternated twice.
mkdir -p /tmp/gb /tmp/o6 && xz -dc .carry/gb30/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o6
trap 'tar czf "$OUT/call6.tgz" -C /tmp o6' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
for r in 1 2; do
  timeout 150 $G decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1 --variants default,pinned,lookahead >> $O/dv_pinned_up.jsonl 2>> $O/dv_pinned_up.log
  BROOK_X_PAGEABLE_UP=1 timeout 150 $G decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1 --variants default,pinned,lookahead >> $O/dv_pageable_up.jsonl 2>> $O/dv_pageable_up.log
done
for f in pinned_up pageable_up; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; done
