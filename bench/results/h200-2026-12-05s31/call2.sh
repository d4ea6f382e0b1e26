#!/usr/bin/env bash
# Session 31, call 2 (carry [".carry/gb31x"]): is it writing host memory behind the graph?
# gpu-bench-x as call 1's plus two tails (experimental, not committed), default path only:
# BROOK_X_TAIL=hostcopy, a 16-byte async device-to-host copy into a page-locked buffer;
# hostkernel, copy_out of 4 words into a mapped page-locked buffer. No event, no wait on them:
# the pageable download follows as usual. Batch 1 at 128 tokens, two rounds.
mkdir -p /tmp/gb /tmp/o2 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o2
trap 'tar czf "$OUT/call2.tgz" -C /tmp o2' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  timeout 150 $G $A --variants default,pinned >> $O/dv_none.jsonl 2>> $O/dv_none.log
  for t in hostcopy hostkernel kernel; do
    BROOK_X_TAIL=$t timeout 100 $G $A --variants default >> $O/dv_$t.jsonl 2>> $O/dv_$t.log
  done
done
for f in none hostcopy hostkernel kernel; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/; s/; lookahead.*//'; tail -3 $O/dv_$f.log | grep -i error; done; true
