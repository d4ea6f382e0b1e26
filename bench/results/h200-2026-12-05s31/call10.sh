#!/usr/bin/env bash
# Session 31, call 10 (carry [".carry/gb31x"]): is lookahead's cost the copy engine's upload
# queued behind the running step? gpu-bench-x is call 9's plus (experimental, not committed)
# BROOK_X_UP=kernel: the step's metadata goes up by a kernel (copy_out) reading the mapped,
# write-combined stage instead of by an async host-to-device copy. Batch 1 at 128 tokens,
# default / pinned / lookahead, without and with it, two rounds.
mkdir -p /tmp/gb /tmp/o10 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o10
trap 'tar czf "$OUT/call10.tgz" -C /tmp o10' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  timeout 100 $G $A --variants default,pinned,lookahead >> $O/dv_none.jsonl 2>> $O/dv_none.log
  BROOK_X_UP=kernel timeout 100 $G $A --variants pinned,lookahead >> $O/dv_kernel.jsonl 2>> $O/dv_kernel.log
done
for f in none kernel; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/dv_$f.log | grep -i error; done; true
