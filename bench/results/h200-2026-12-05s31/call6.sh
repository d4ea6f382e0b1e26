#!/usr/bin/env bash
# Session 31, call 6 (carry [".carry/gb31x"]): where inside the step does the pinned path's time
# go? gpu-bench-x as call 5's plus (experimental, not committed) BROOK_X_STAMPS: three more stamp
# kernels in the forward (before layer 0, before layer 16, after layer 31) write the GPU timer
# into a mapped page-locked buffer; every 200 batch-1 steps the medians of the four segments
# (start -> L0, L0 -> L16, L16 -> L32, L32 -> end) are printed. Default and pinned, and pinned
# with BROOK_X_PIN=noevent (call 4: no cost), two rounds.
mkdir -p /tmp/gb /tmp/o6 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1 BROOK_X_STAMPS=1
G=/tmp/gb/gpu-bench-x O=/tmp/o6
trap 'tar czf "$OUT/call6.tgz" -C /tmp o6' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  timeout 100 $G $A --variants default,pinned >> $O/dv_none.jsonl 2>> $O/dv_none.log
  BROOK_X_PIN=noevent timeout 100 $G $A --variants pinned >> $O/dv_noevent.jsonl 2>> $O/dv_noevent.log
done
for f in none noevent; do echo "== $f"; grep "ms/step\|X_STAMPS" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/; s/; lookahead.*//'; tail -3 $O/dv_$f.log | grep -i error; done; true
