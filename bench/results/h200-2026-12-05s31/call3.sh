#!/usr/bin/env bash
# Session 31, call 3 (carry [".carry/gb31x"]): which part of the pinned path costs? gpu-bench-x
# as call 2's plus BROOK_X_PIN (experimental, not committed), pinned path only: streamsync, the
# host synchronises the stream before waiting on the stage's event; event_first, the event is
# recorded before copy_out (the host may read the stage early: timing only); pageable_dl, no
# copy_out: the event after the graph, and the outputs by the pageable download. Batch 1 at 128
# tokens, default and pinned under each, two rounds.
mkdir -p /tmp/gb /tmp/o3 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o3
trap 'tar czf "$OUT/call3.tgz" -C /tmp o3' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  for x in none streamsync event_first pageable_dl; do
    BROOK_X_PIN=$x timeout 100 $G $A --variants default,pinned >> $O/dv_$x.jsonl 2>> $O/dv_$x.log
  done
done
for f in none streamsync event_first pageable_dl; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/; s/; lookahead.*//'; tail -3 $O/dv_$f.log | grep -i error; done; true
