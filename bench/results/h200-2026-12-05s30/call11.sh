#!/usr/bin/env bash
# Session 30, call 11 (carry [".carry/gb30c"], copy_out's gpu-bench), asked of an H200
# (needs_h200): batch-1 decode through the scheduler, default against lookahead, at 128 tokens,
# two rounds.
mkdir -p /tmp/gb /tmp/o11 && xz -dc .carry/gb30c/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=/tmp/o11
trap 'tar czf "$OUT/call11.tgz" -C /tmp o11' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
for r in 1 2; do
  timeout 100 /tmp/gb/gpu-bench decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1 --variants default,lookahead >> $O/dv.jsonl 2>> $O/dv.log
done
grep "ms/step" $O/dv.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'
