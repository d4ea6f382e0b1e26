#!/usr/bin/env bash
# Session 34, call 1 (binaries: pack1.sh; carry [".carry/gb34"]):
# 1. The gemv chain (kernels/gemv_chain.cu): its kernel test against the CPU reference
#    (cuda_kernels gemv_chain) and the decode layers on it against the CPU (cuda_e2e gemv_chain).
# 2. gpu-bench stream-floor: the chain over every matrix in one launch beside the ring / gemv
#    one-launch and per-matrix figures.
# 3. Decode batch 1 on 7B shapes with the chain off and on (gpu-bench decode --quick), and
#    decode-variants with it on (ctx 128 / 3,800, GPU gaps).
# 4. Session 33's call4 (not run): EngineCore::shutdown against the exit crash, lookahead
#    "auto" at batch 512 and 1 through the actors, cuda_ws / cuda_models with auto as the
#    default (brook, cuda_ws, cuda_models built so), to decide the default.
set -u
mkdir -p /tmp/gb "$OUT/o1" && for b in brook gpu-bench cuda_ws cuda_models cuda_kernels cuda_e2e; do
  xz -dc .carry/gb34/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
timeout 60 /tmp/gb/cuda_kernels gemv_chain --test-threads 1 > $O/tests.log 2>&1; echo "cuda_kernels gemv_chain rc $?"
timeout 90 /tmp/gb/cuda_e2e gemv_chain --test-threads 1 --nocapture >> $O/tests.log 2>&1; echo "cuda_e2e gemv_chain rc $?"
grep -h "test result\|FAILED\|panicked\|error" $O/tests.log | head -20
timeout 90 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
echo "stream-floor rc $?"; grep "stream floor\|rror" $O/floor.log
for c in 0 1 0 1; do
  BROOK_GEMV_CHAIN=$c timeout 60 /tmp/gb/gpu-bench decode --model llama-2-7b --quick >> $O/decode.jsonl 2>> $O/decode.log
  echo "decode chain=$c rc $?"
done
grep "median\|rror" $O/decode.log
BROOK_GEMV_CHAIN=1 timeout 110 /tmp/gb/gpu-bench decode-variants --model llama-2-7b --output-len 512 --batch 1 --input-len 128,3800 --variants default,lookahead-auto >> $O/decode.jsonl 2>> $O/variants.log
echo "decode-variants chain rc $?"; grep -v "^\s*$" $O/variants.log | grep -iv "synthetic weights" | tail -8
B="/tmp/gb/brook bench --synthetic llama-2-7b --device cuda"
for la in off auto; do
  timeout 50 $B --cuda-lookahead $la --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192 >> $O/serve.log 2>&1
  echo "b512 lookahead $la rc $?" | tee -a $O/serve.log
  timeout 45 $B --cuda-lookahead $la --num-prompts 1 --input-len 128 --output-len 512 >> $O/serve.log 2>&1
  echo "b1 lookahead $la rc $?" | tee -a $O/serve.log
done
grep "rc\|output tok\|ITL\|executor" $O/serve.log
dmesg 2>/dev/null | grep -ci segfault | sed 's/^/segfaults in dmesg: /'
timeout 60 /tmp/gb/cuda_ws --test-threads 1 > $O/ws.log 2>&1; echo "cuda_ws rc $?"
timeout 60 /tmp/gb/cuda_models --test-threads 1 >> $O/ws.log 2>&1; echo "cuda_models rc $?"
grep -h "test result\|FAILED\|panicked" $O/ws.log
