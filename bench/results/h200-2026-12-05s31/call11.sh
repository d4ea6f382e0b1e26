#!/usr/bin/env bash
# Session 31, call 11 (carry [".carry/gb31x"], call 10's build, flag-build.diff): lookahead with
# both of call 9-10's remedies at once (BROOK_X_UP=kernel and BROOK_X_WAIT=blocking), against
# each alone and neither. Batch 1 at 128 tokens, two rounds.
mkdir -p /tmp/gb /tmp/o11 && xz -dc .carry/gb31x/gpu-bench-x.xz > /tmp/gb/gpu-bench-x && chmod +x /tmp/gb/gpu-bench-x || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-x O=/tmp/o11
trap 'tar czf "$OUT/call11.tgz" -C /tmp o11' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
A="decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1"
for r in 1 2; do
  timeout 100 $G $A --variants default,lookahead >> $O/dv_none.jsonl 2>> $O/dv_none.log
  BROOK_X_UP=kernel BROOK_X_WAIT=blocking timeout 100 $G $A --variants lookahead >> $O/dv_both.jsonl 2>> $O/dv_both.log
done
for f in none both; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/dv_$f.log | grep -i error; done; true
