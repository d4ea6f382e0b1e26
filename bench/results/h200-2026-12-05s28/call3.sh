#!/usr/bin/env bash
# Session 28, call 3 (carry [".carry/gb28"], packed by pack.sh at this commit):
#  1. The fp8 GEMM path after its cuBLASLt descriptors moved to `lt_desc` (shared with
#     `gpu-bench gemm-algos`): the fp8 kernel and CUDA-vs-CPU tests, and gemm-algos once.
#     The warm-up's batch-1 step at the short context (call 2: batch 1's first step still
#     paid 3.6 ms): `gpu-bench cold --warm-up`, and the warm-up test.
#  2. On an H200 only: TTFT 2048 back to back against 300 ms idle before each run, alternated
#     twice, with nvidia-smi sampling SM clock, power and the clock-event (throttle) reasons
#     every 20 ms; offline 512x128/128 and decode batch 1 for the record.
# Every log goes into one tarball (call 1's smi.csv did not come back: too many files).
mkdir -p /tmp/gb /tmp/o && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc .carry/gb28/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call3.tgz" -C /tmp o' EXIT
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.max.mem --format=csv | tee $O/gpu.txt
timeout 100 /tmp/gb/cuda_kernels fp8 --test-threads 1 >$O/cuda_kernels.log 2>&1; echo "cuda_kernels fp8 rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_kernels.log | head
timeout 150 /tmp/gb/cuda_e2e warm_up weights_fp8 --test-threads 1 >$O/cuda_e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_e2e.log | head
timeout 60 $G gemm-algos --model llama-2-7b --tokens 2048 --algos 4 >$O/gemm_algos.jsonl 2>$O/gemm_algos.log; echo "gemm-algos rc $?"
grep -v "INFO\|BackendInfo" $O/gemm_algos.log
timeout 120 $G cold --model llama-2-7b --warm-up >>$O/cold.jsonl 2>>$O/cold.log; echo "cold rc $?"
grep -v "INFO\|BackendInfo" $O/cold.log
case "$NAME" in *H200*) ;; *) echo "not an H200: TTFT clocks left for an H200"; exit 0;; esac
G=$G O=$O bash "$(dirname "$0")/ttft_clocks.sh"
