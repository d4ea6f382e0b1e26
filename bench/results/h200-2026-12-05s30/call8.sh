#!/usr/bin/env bash
# Session 30, call 8 (carry [".carry/gb30"]): is it the pinned download? gpu-bench-d is 2b50d42's
# gpu-bench with one experimental line in PinnedIo::download (not committed): with
# BROOK_X_NO_DL set, the step's outputs are not copied back at all (the event is still recorded;
# the host reads stale tokens, so only the timing means anything). Batch 1 at 128 tokens,
# default and pinned, without and with it, two rounds.
mkdir -p /tmp/gb /tmp/o8 && xz -dc .carry/gb30/gpu-bench-d.xz > /tmp/gb/gpu-bench-d && chmod +x /tmp/gb/gpu-bench-d || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-d O=/tmp/o8
trap 'tar czf "$OUT/call8.tgz" -C /tmp o8' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
for r in 1 2; do
  timeout 150 $G decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1 --variants default,pinned >> $O/dv_dl.jsonl 2>> $O/dv_dl.log
  BROOK_X_NO_DL=1 timeout 150 $G decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1 --variants pinned >> $O/dv_nodl.jsonl 2>> $O/dv_nodl.log
done
for f in dl nodl; do echo "== $f"; grep "ms/step" $O/dv_$f.log | sed 's/.*llama-2-7b decode //; s/; lookahead.*//'; tail -3 $O/dv_$f.log | grep -i error; done
