#!/usr/bin/env bash
# Session 35, call 1 (binaries: session 34's pack3.sh at 5c35379, carry [".carry/gb34c"]):
# session 34's call 3 cut to ~5 minutes: cuda_e2e whole (the persistent-batch tests after
# fa68b96), the chain kernel test as 0a3f4dc left it, brook bench batch 1 off / auto.
set -u
mkdir -p /tmp/gb "$OUT/o1" && for b in gpu-bench cuda_e2e cuda_kernels brook; do
  xz -dc .carry/gb34c/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/tests.log 2>&1; echo "cuda_e2e rc $?"
timeout 60 /tmp/gb/cuda_kernels gemv_chain --test-threads 1 >> $O/tests.log 2>&1; echo "cuda_kernels gemv_chain rc $?"
grep -h "test result\|FAILED\|panicked" $O/tests.log | head -10
B="/tmp/gb/brook bench --synthetic llama-2-7b --device cuda"
for la in off auto off auto; do
  timeout 45 $B --cuda-lookahead $la --num-prompts 1 --input-len 128 --output-len 512 >> $O/serve.log 2>&1
  echo "b1 lookahead $la rc $?" | tee -a $O/serve.log
done
grep "rc\|output tok\|ITL\|executor\|outside" $O/serve.log | head -40
