#!/usr/bin/env bash
# Session 31, call 5 (carry [".carry/gb31x"]): reused events? gpu-bench-x as call 4's plus
# (experimental, not committed) BROOK_X_PIN=fresh, each pinned download records a newly created
# event (the stage's old one dropped) instead of re-recording the stage's; notake, a stage is
# taken without synchronising its event (its outputs were already waited for). Batch 1 at 128
# tokens, default / pinned / lookahead under each, two rounds.
mkdir -p /tmp/gb /tmp/o5 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o5
trap 'tar czf "$OUT/call5.tgz" -C /tmp o5' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  for x in none fresh notake; do
    BROOK_X_PIN=$x timeout 100 $G $A --variants default,pinned,lookahead >> $O/dv_$x.jsonl 2>> $O/dv_$x.log
  done
done
for f in none fresh notake; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/dv_$f.log | grep -i error; done; true
