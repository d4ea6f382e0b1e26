#!/usr/bin/env bash
# Session 31, call 13 (carry [".carry/gb30c"]: session 30's copy_out build, main's code): is the
# pinned path's cost an artifact of running variants one after another in one process? (Every
# variant that ran first in its process was fast in calls 1-12; every one that ran after another
# backend was slow.) Default, lookahead, pinned and default again, each alone in its own process.
mkdir -p /tmp/gb /tmp/o13 && xz -dc .carry/gb30c/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o13
trap 'tar czf "$OUT/call13.tgz" -C /tmp o13' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for v in default lookahead pinned default; do
  timeout 40 $G $A --variants $v >> $O/dv.jsonl 2>> $O/dv.log
done
grep "ms/step" $O/dv.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; true
