#!/usr/bin/env bash
# Session 31, call 4 (carry [".carry/gb31x"]): is it the event? gpu-bench-x as call 3's plus
# (experimental, not committed) BROOK_X_TAIL=event, the default path records a fresh event
# (timing disabled) after the graph and never waits on it; event_wait, and synchronises it
# before the pageable download; BROOK_X_PIN=noevent, the pinned path records no event and the
# host synchronises the stream instead. Batch 1 at 128 tokens, two rounds.
mkdir -p /tmp/gb /tmp/o4 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o4
trap 'tar czf "$OUT/call4.tgz" -C /tmp o4' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  timeout 100 $G $A --variants default,pinned >> $O/dv_none.jsonl 2>> $O/dv_none.log
  for t in event event_wait; do
    BROOK_X_TAIL=$t timeout 100 $G $A --variants default >> $O/dv_$t.jsonl 2>> $O/dv_$t.log
  done
  BROOK_X_PIN=noevent timeout 100 $G $A --variants pinned >> $O/dv_noevent.jsonl 2>> $O/dv_noevent.log
done
for f in none event event_wait noevent; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/; s/; lookahead.*//'; tail -3 $O/dv_$f.log | grep -i error; done; true
