#!/usr/bin/env bash
# Session 31's next call (NOT RUN: no device time was left; carry [".carry/gb31"] from pack.sh
# at the commit that added it). Best on the H200 (needs_h200), else an H100; about 2 minutes.
# 1. decode-variants as it now runs (each variant in its own process): default against
#    lookahead at batch 1, 128 and 3.8k tokens, two rounds; checks the isolation on a GPU.
# 2. The order effect: two default backends one after the other in one process, with the
#    memory pool's reserved/used bytes after each drop; then the same with the pool trimmed
#    between them. If trimming removes the second backend's ~0.7 %, the pool's reuse of the
#    first backend's memory is the cause.
mkdir -p /tmp/gb /tmp/o14 && xz -dc .carry/gb31/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o14
trap 'tar czf "$OUT/call14.tgz" -C /tmp o14' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --output-len 512 --batch 1"
for r in 1 2; do
  timeout 100 $G $A --input-len 128,3800 --variants default,lookahead >> $O/dv.jsonl 2>> $O/dv.log
done
timeout 100 $G $A --input-len 128 --variants default,default,default --same-process >> $O/same.jsonl 2>> $O/same.log
timeout 100 $G $A --input-len 128 --variants default,default,default --same-process --trim-pool >> $O/trim.jsonl 2>> $O/trim.log
for f in dv same trim; do echo "== $f"; grep "ms/step\|memory pool" $O/$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/$f.log | grep -i error; done; true
