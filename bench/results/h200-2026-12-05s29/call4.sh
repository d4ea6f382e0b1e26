#!/usr/bin/env bash
# Session 29, call 4 (carry [".carry/gb29"], call 3's binaries), asked of an H200 (needs_h200):
# TTFT 2048 with BROOK_GATE_UP_BF16=0/1, rested (--gap-ms 300) alternated twice and back to back
# once each; offline 512 x 128/128 once each.
mkdir -p /tmp/gb /tmp/o && xz -dc .carry/gb29/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call4.tgz" -C /tmp o' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
for r in 1 2; do for b in 0 1; do
  BROOK_GATE_UP_BF16=$b timeout 60 $G ttft --model llama-2-7b --input-len 2048 --gap-ms 300 >>$O/ttft_b$b.jsonl 2>>$O/ttft_b$b.log
  echo "ttft rested bf16 $b: $(grep -v 'INFO\|BackendInfo' $O/ttft_b$b.log | tail -1 | sed 's/.*idle before each: //')"
done; done
for b in 0 1; do
  BROOK_GATE_UP_BF16=$b timeout 60 $G ttft --model llama-2-7b --input-len 2048 >>$O/ttft_b2b_b$b.jsonl 2>>$O/ttft_b2b_b$b.log
  echo "ttft back to back bf16 $b: $(grep -v 'INFO\|BackendInfo' $O/ttft_b2b_b$b.log | tail -1 | sed 's/.*skipped \[\]: //')"
done
for b in 0 1; do
  BROOK_GATE_UP_BF16=$b timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 >>$O/offline_b$b.jsonl 2>>$O/offline_b$b.log
  echo "offline bf16 $b: $(tail -1 $O/offline_b$b.log)"
done
