#!/usr/bin/env bash
# Session 34, call 3b. NOT RUN (03:26-03:30 UTC: held off, then too little device time left to
# start a machine). call3.sh cut to what ~4 minutes of device time hold (binaries: pack3.sh;
# carry [".carry/gb34c"]): the persistent-batch tests after fa68b96's fix and the chain kernel
# as 0a3f4dc left it; then its stream floor if time is left.
set -u
mkdir -p /tmp/gb "$OUT/o3" && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc .carry/gb34c/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
timeout 60 /tmp/gb/cuda_e2e persistent --test-threads 1 > $O/tests.log 2>&1; echo "cuda_e2e persistent rc $?"
timeout 40 /tmp/gb/cuda_kernels gemv_chain --test-threads 1 >> $O/tests.log 2>&1; echo "cuda_kernels gemv_chain rc $?"
grep -h "test result\|FAILED\|panicked" $O/tests.log | head -10
timeout 60 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
echo "stream-floor rc $?"; grep "stream floor" $O/floor.log | grep "chain\|gemv, per"
