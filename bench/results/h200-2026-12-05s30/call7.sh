#!/usr/bin/env bash
# Session 30, call 7 (carry [".carry/gb30"]): is it how the host waits? gpu-bench-w is 2b50d42's
# gpu-bench with an experimental PinnedIo::wait (not committed): BROOK_X_WAIT unset, the event's
# synchronize (as committed); "spin", a loop of cuEventQuery with spin hints; "yield", the same
# loop yielding the thread. Batch 1 at 128 tokens, default and pinned, two rounds.
mkdir -p /tmp/gb /tmp/o7 && xz -dc .carry/gb30/gpu-bench-w.xz > /tmp/gb/gpu-bench-w && chmod +x /tmp/gb/gpu-bench-w || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench-w O=/tmp/o7
trap 'tar czf "$OUT/call7.tgz" -C /tmp o7' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
for r in 1 2; do for w in sync spin yield; do
  BROOK_X_WAIT=$w timeout 150 $G decode-variants --model llama-2-7b --input-len 128 --output-len 512 --batch 1 --variants default,pinned >> $O/dv_$w.jsonl 2>> $O/dv_$w.log
done; done
for w in sync spin yield; do echo "== $w"; grep "ms/step" $O/dv_$w.log | sed 's/.*llama-2-7b decode //; s/; lookahead.*//'; done
