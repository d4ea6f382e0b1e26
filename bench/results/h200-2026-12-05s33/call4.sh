#!/usr/bin/env bash
# Session 33's last GPU call: EngineCore::shutdown (79928b1) against the exit crash that call 3
# saw (every `brook bench --synthetic llama-2-7b --device cuda` at 512 x 128/128 segfaulted in
# libcublasLt after printing its figures). Carry [".carry/gb33"] (brook and gpu-bench at 79928b1).
set -u
mkdir -p /tmp/gb "$OUT/o4" && for b in brook gpu-bench; do
  xz -dc .carry/gb33/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
for r in 1 2 3; do
  timeout 50 /tmp/gb/brook bench --synthetic llama-2-7b --device cuda --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192 >> $O/b512.log 2>&1
  echo "run $r rc $?" | tee -a $O/b512.log
done
grep "output tok\|executor" $O/b512.log
dmesg 2>/dev/null | grep -ci segfault | sed 's/^/segfaults in dmesg: /'
timeout 60 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
grep "stream floor\|rror" $O/floor.log
