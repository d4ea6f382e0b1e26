#!/usr/bin/env bash
# Session 33's last GPU call: EngineCore::shutdown (79928b1) against the exit crash that call 3
# saw (every `brook bench --synthetic llama-2-7b --device cuda` at 512 x 128/128 segfaulted in
# libcublasLt after printing its figures), and lookahead "auto" as the serving default: the
# serving runs below, cuda_ws and cuda_models start engines from the config (now auto).
# Carry [".carry/gb33"]: brook, gpu-bench, cuda_ws, cuda_models at the commit that made auto
# the default.
set -u
mkdir -p /tmp/gb "$OUT/o4" && for b in brook gpu-bench cuda_ws cuda_models; do
  xz -dc .carry/gb33/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
for r in 1 2; do
  timeout 50 /tmp/gb/brook bench --synthetic llama-2-7b --device cuda --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192 >> $O/b512.log 2>&1
  echo "run $r rc $?" | tee -a $O/b512.log
done
grep "output tok\|executor" $O/b512.log
timeout 50 /tmp/gb/brook bench --synthetic llama-2-7b --device cuda --num-prompts 1 --input-len 128 --output-len 512 >> $O/b1.log 2>&1
echo "b1 rc $?" | tee -a $O/b1.log; grep "ITL\|executor" $O/b1.log
dmesg 2>/dev/null | grep -ci segfault | sed 's/^/segfaults in dmesg: /'
timeout 60 /tmp/gb/cuda_ws --test-threads 1 > $O/ws.log 2>&1; echo "cuda_ws rc $?"
timeout 60 /tmp/gb/cuda_models --test-threads 1 > $O/models.log 2>&1; echo "cuda_models rc $?"
grep -h "test result\|FAILED\|panicked" $O/ws.log $O/models.log
timeout 60 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
grep "stream floor\|rror" $O/floor.log
