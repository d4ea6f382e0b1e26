#!/usr/bin/env bash
# Session 28, call 2 (carry [".carry/gb28"], packed by pack.sh at this commit):
#  1. Every cuda_e2e test: call 1's one failure (kv_tier's fork compared with another batch's
#     output) rewritten; the warm-up now also runs a decode step at every graph bucket.
#  2. `gpu-bench cold` without and with the warm-up: each batch size's first decode step; and
#     with it at context 1000, where a bucket's split count differs from the warm-up's (128),
#     so a first step there still captures its graph (cuBLAS already warm).
#  3. `gpu-bench gemm-algos`: the prefill GEMMs (512 and 2048 rows) on cuBLAS's own choice
#     against each candidate of cuBLASLt's heuristic: would timing them at start pay?
#  4. On an H200 only: TTFT 2048 back to back against 300 ms idle before each run, alternated
#     twice, with nvidia-smi sampling SM clock, power and the clock-event (throttle) reasons
#     every 20 ms; offline 512x128/128 and decode batch 1 for the record.
# Every log goes into one tarball (call 1's smi.csv did not come back: too many files).
mkdir -p /tmp/gb /tmp/o && for b in gpu-bench cuda_e2e; do
  xz -dc .carry/gb28/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call2.tgz" -C /tmp o' EXIT
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.max.mem --format=csv | tee $O/gpu.txt
timeout 200 /tmp/gb/cuda_e2e --test-threads 1 >$O/cuda_e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_e2e.log | head -20
for w in "" --warm-up "--warm-up --context 1000"; do
  timeout 120 $G cold --model llama-2-7b $w >>$O/cold.jsonl 2>>$O/cold.log; echo "cold $w rc $?"
done
grep -v "INFO\|BackendInfo" $O/cold.log
timeout 120 $G gemm-algos --model llama-2-7b >$O/gemm_algos.jsonl 2>$O/gemm_algos.log; echo "gemm-algos rc $?"
grep -v "INFO\|BackendInfo" $O/gemm_algos.log
case "$NAME" in *H200*) ;; *) echo "not an H200: TTFT clocks left for an H200"; exit 0;; esac
G=$G O=$O bash "$(dirname "$0")/ttft_clocks.sh"
