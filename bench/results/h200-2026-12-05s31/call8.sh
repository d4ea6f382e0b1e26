#!/usr/bin/env bash
# Session 31, call 8 (carry [".carry/gb31x"]): does a driver call on the stream after the launch
# remove the pinned path's cost? gpu-bench-x is call 7's build (flag words, no events) plus
# (experimental, not committed) BROOK_X_FLUSH=query, one cuStreamQuery after copy_out's launch;
# query_graph, one right after the graph's launch. Batch 1 at 128 tokens, default / pinned /
# lookahead under each, two rounds.
mkdir -p /tmp/gb /tmp/o8 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o8
trap 'tar czf "$OUT/call8.tgz" -C /tmp o8' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  for x in none query query_graph; do
    BROOK_X_FLUSH=$x timeout 100 $G $A --variants default,pinned,lookahead >> $O/dv_$x.jsonl 2>> $O/dv_$x.log
  done
done
for f in none query query_graph; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/dv_$f.log | grep -i error; done; true
