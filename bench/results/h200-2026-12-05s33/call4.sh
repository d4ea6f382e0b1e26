#!/usr/bin/env bash
# NOT RUN in session 33: its device time ran out after call 3 (refused starts). For the next
# session: pack4.sh here packs brook, gpu-bench and the cuda_ws / cuda_models test binaries of
# the checkout into .carry/gb33; carry [".carry/gb33"]:
# 1. EngineCore::shutdown (79928b1) against the exit crash call 3 saw: every `brook bench
#    --synthetic llama-2-7b --device cuda` at 512 x 128/128 segfaulted in libcublasLt after
#    printing its figures. Each run's exit code, and dmesg's segfault count.
# 2. Lookahead "auto" through the actors at batch 512 and batch 1 (call 3 ran it at batch 1
#    only): if these and cuda_ws / cuda_models pass with auto as the default (a build with
#    LookaheadMode's default moved to Auto, as cd498aa did before it was reverted), make it
#    the default.
# 3. gpu-bench stream-floor on whichever card comes (call 3's figures are an H100's).
set -u
mkdir -p /tmp/gb "$OUT/o4" && for b in brook gpu-bench cuda_ws cuda_models; do
  xz -dc .carry/gb33/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
B="/tmp/gb/brook bench --synthetic llama-2-7b --device cuda"
for la in off auto off auto; do
  timeout 50 $B --cuda-lookahead $la --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192 >> $O/b512.log 2>&1
  echo "b512 lookahead $la rc $?" | tee -a $O/b512.log
done
grep "rc\|output tok\|executor" $O/b512.log
for la in off auto; do
  timeout 50 $B --cuda-lookahead $la --num-prompts 1 --input-len 128 --output-len 512 >> $O/b1.log 2>&1
  echo "b1 lookahead $la rc $?" | tee -a $O/b1.log
done
grep "rc\|ITL\|executor" $O/b1.log
dmesg 2>/dev/null | grep -ci segfault | sed 's/^/segfaults in dmesg: /'
timeout 60 /tmp/gb/cuda_ws --test-threads 1 > $O/ws.log 2>&1; echo "cuda_ws rc $?"
timeout 60 /tmp/gb/cuda_models --test-threads 1 > $O/models.log 2>&1; echo "cuda_models rc $?"
grep -h "test result\|FAILED\|panicked" $O/ws.log $O/models.log
timeout 60 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
grep "stream floor\|rror" $O/floor.log
