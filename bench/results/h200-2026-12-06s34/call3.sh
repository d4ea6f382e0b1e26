#!/usr/bin/env bash
# Session 34, call 3 (binaries: pack3.sh; carry [".carry/gb34c"]). NOT RUN: the refused starts
# left too little device time (call3b.sh is its cut-down form).
# 1. cuda_e2e again: call 2's two failures were the persistent-batch test expecting step stamps
#    whenever lookahead is on, which the new default ("auto") turned on in its base variant; its
#    base is now explicitly off (the "lookahead_auto" variant is the serving default).
# 2. The chain kernel as stream-floor now builds it (one barrier rule, no PDL; 0a3f4dc):
#    cuda_kernels gemv_chain and stream-floor.
# 3. Lookahead "auto" (the new default) on the H200: gpu-bench decode-variants default (off) /
#    lookahead-auto, and brook bench through the actors at batch 1 and 512, off and auto.
set -u
mkdir -p /tmp/gb "$OUT/o3" && for b in gpu-bench cuda_e2e cuda_kernels brook; do
  xz -dc .carry/gb34c/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
timeout 120 /tmp/gb/cuda_e2e --test-threads 1 > $O/tests.log 2>&1; echo "cuda_e2e rc $?"
timeout 60 /tmp/gb/cuda_kernels gemv_chain --test-threads 1 >> $O/tests.log 2>&1; echo "cuda_kernels gemv_chain rc $?"
grep -h "test result\|FAILED\|panicked" $O/tests.log | head -10
timeout 90 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
echo "stream-floor rc $?"; grep "stream floor" $O/floor.log | grep "chain\|gemv, per"
timeout 100 /tmp/gb/gpu-bench decode-variants --model llama-2-7b --output-len 512 --batch 1 --input-len 128,3800 --variants default,lookahead-auto > $O/dv.jsonl 2> $O/dv.log
echo "decode-variants rc $?"; grep "decode \[" $O/dv.log
B="/tmp/gb/brook bench --synthetic llama-2-7b --device cuda"
for la in off auto; do
  timeout 45 $B --cuda-lookahead $la --num-prompts 1 --input-len 128 --output-len 512 >> $O/serve.log 2>&1
  echo "b1 lookahead $la rc $?" | tee -a $O/serve.log
  timeout 45 $B --cuda-lookahead $la --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192 >> $O/serve.log 2>&1
  echo "b512 lookahead $la rc $?" | tee -a $O/serve.log
done
grep "rc\|output tok\|ITL\|executor" $O/serve.log
