#!/usr/bin/env bash
# Session 31, call 9 (carry [".carry/gb31x"]): is it how the host waits? gpu-bench-x is call 7's
# build (flag words, no events) plus (experimental, not committed) BROOK_X_WAIT=streamsync, the
# host synchronises the stream before it reads the flag (pinned only: lookahead's stream holds
# the next step); blocking, an event created with CU_EVENT_BLOCKING_SYNC is recorded after
# copy_out and the host sleeps on it before it reads the flag. Batch 1 at 128 tokens, two rounds.
mkdir -p /tmp/gb /tmp/o9 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o9
trap 'tar czf "$OUT/call9.tgz" -C /tmp o9' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  timeout 100 $G $A --variants default,pinned,lookahead >> $O/dv_none.jsonl 2>> $O/dv_none.log
  BROOK_X_WAIT=streamsync timeout 100 $G $A --variants pinned >> $O/dv_streamsync.jsonl 2>> $O/dv_streamsync.log
  BROOK_X_WAIT=blocking timeout 100 $G $A --variants pinned,lookahead >> $O/dv_blocking.jsonl 2>> $O/dv_blocking.log
done
for f in none streamsync blocking; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/dv_$f.log | grep -i error; done; true
