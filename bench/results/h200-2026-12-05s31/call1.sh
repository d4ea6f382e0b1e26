#!/usr/bin/env bash
# Session 31, call 1 (carry [".carry/gb31x"]): does work queued behind a decode graph slow it?
# gpu-bench-x is 4538b02's gpu-bench with one experimental block in Forward::launch_step (not
# committed): in the default (pageable) path, BROOK_X_TAIL=kernel launches a one-block kernel
# (copy_out of 4 device words onto themselves) right after the graph, BROOK_X_TAIL=copy a 16-byte
# device-to-device copy. Batch 1 at 128 tokens; default / pinned / lookahead, then default with
# each tail; two rounds.
mkdir -p /tmp/gb /tmp/o1 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o1
trap 'tar czf "$OUT/call1.tgz" -C /tmp o1' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  timeout 150 $G $A --variants default,pinned,lookahead >> $O/dv_none.jsonl 2>> $O/dv_none.log
  BROOK_X_TAIL=kernel timeout 100 $G $A --variants default >> $O/dv_kernel.jsonl 2>> $O/dv_kernel.log
  BROOK_X_TAIL=copy timeout 100 $G $A --variants default >> $O/dv_copy.jsonl 2>> $O/dv_copy.log
done
for f in none kernel copy; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/dv_$f.log | grep -i error; done
