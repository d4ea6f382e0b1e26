#!/usr/bin/env bash
# Session 30, call 4 (carry [".carry/gb30"], call 1's gpu-bench): where lookahead's extra GPU
# time comes from: default, pinned I/O alone (which lookahead implies) and lookahead, batch 1 at
# 128 tokens, three rounds alternated.
mkdir -p /tmp/gb /tmp/o && xz -dc .carry/gb30/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call4.tgz" -C /tmp o' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
for r in 1 2 3; do
  timeout 150 $G decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1 --variants default,pinned,lookahead >> $O/dv.jsonl 2>> $O/dv.log
done
grep "ms/step" $O/dv.log | sed 's/.*llama-2-7b decode //'
