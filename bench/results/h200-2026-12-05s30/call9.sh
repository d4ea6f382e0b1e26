#!/usr/bin/env bash
# Session 30, call 9 (carry [".carry/gb30c": call 1s gpu-bench as gpu-bench-old, this commits gpu-bench and cuda_e2e]): pinned I/O with the outputs stored
# by a kernel into the mapped stage (copy_out, this commit) against the copy-engine
# download (2b50d42 code: call 1 gpu-bench). First the CUDA-vs-CPU tests that
# run pinned I/O and lookahead (persistent batch, sliding window, penalties, speculative
# decoding), then batch-1 decode through the scheduler (default / pinned / lookahead) with both
# builds, and offline 512 x 128/128 untimed / lookahead with the new one.
mkdir -p /tmp/gb /tmp/o9 || exit 1
xz -dc .carry/gb30c/gpu-bench-old.xz > /tmp/gb/gpu-bench-old && xz -dc .carry/gb30c/gpu-bench.xz > /tmp/gb/gpu-bench && xz -dc .carry/gb30c/cuda_e2e.xz > /tmp/gb/cuda_e2e && chmod +x /tmp/gb/* || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=/tmp/o9
trap 'tar czf "$OUT/call9.tgz" -C /tmp o9' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
timeout 200 /tmp/gb/cuda_e2e --test-threads 1 persistent_batch sliding_window penalties cuda_spec > $O/e2e.log 2>&1; echo "cuda_e2e rc $?: $(grep 'test result' $O/e2e.log)"
grep -E "FAILED|panicked" $O/e2e.log | head -5
for r in 1 2; do for b in gpu-bench gpu-bench-old; do
  timeout 150 /tmp/gb/$b decode-variants --model llama-2-7b --input-len 128,3800 --output-len 256 --batch 1 --variants default,pinned,lookahead >> $O/dv_$b.jsonl 2>> $O/dv_$b.log
done; done
for b in gpu-bench gpu-bench-old; do echo "== $b"; grep "ms/step" $O/dv_$b.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; done
for v in untimed lookahead; do
  timeout 120 /tmp/gb/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --variants $v >> $O/offline_$v.jsonl 2>> $O/offline_$v.log
  echo "offline $v: $(grep -v 'INFO\|BackendInfo' $O/offline_$v.log | tail -1)"
done
