#!/usr/bin/env bash
# Session 30, call 3 (carry [".carry/gb30"], call 1's gpu-bench): lookahead decode (off by
# default since session 12) measured again on today's kernels: decode through the scheduler at
# batch 1 (128 and 3.8k tokens) and batch 8, default against lookahead (both with step stamps:
# GPU idle gap between steps); offline 512 x 128/128 untimed against lookahead, alternated.
mkdir -p /tmp/gb /tmp/o && xz -dc .carry/gb30/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call3.tgz" -C /tmp o' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
for r in 1 2; do
  timeout 150 $G decode-variants --model llama-2-7b --input-len 128,3800 --batch 1 --variants default,lookahead >> $O/dv_b1.jsonl 2>> $O/dv_b1.log
  timeout 100 $G decode-variants --model llama-2-7b --input-len 128 --batch 8 --variants default,lookahead >> $O/dv_b8.jsonl 2>> $O/dv_b8.log
done
grep "ms/step" $O/dv_b1.log $O/dv_b8.log | sed 's/.*llama-2-7b decode //'
for r in 1 2; do for v in untimed lookahead; do
  timeout 120 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --variants $v >> $O/offline_$v.jsonl 2>> $O/offline_$v.log
  echo "offline $v: $(grep -v 'INFO\|BackendInfo' $O/offline_$v.log | tail -1)"
done; done
