#!/usr/bin/env bash
# Session 35, call 2 (binaries: scripts/gpu-pack.sh .carry/gb35a at the cluster-merge commit, plus
# gpu-bench-old = 5c35379's; carry [".carry/gb35a"]): decode splits merged in a thread-block
# cluster (distributed shared memory) against the in-kernel global merge.
set -u
mkdir -p /tmp/gb "$OUT/o2" && for b in gpu-bench gpu-bench-old cuda_e2e cuda_kernels; do
  xz -dc .carry/gb35a/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
# 1. Correctness: the cluster merge and the merges whose code it shares.
timeout 150 /tmp/gb/cuda_kernels paged_decode_cluster paged_decode_filled paged_decode_inline --test-threads 2 > $O/tests.log 2>&1; echo "cuda_kernels rc $?"
timeout 60 /tmp/gb/cuda_e2e cluster --test-threads 1 >> $O/tests.log 2>&1; echo "cuda_e2e cluster rc $?"
grep -h "test result\|FAILED\|panicked" $O/tests.log | head -10
# 2. The kernel alone: batch 1-4, Llama-2-7B and Llama-3-8B heads.
V=fill8-inline,fill8-cluster,fill4-inline-mma,fill4-cluster-mma,fill4-k128-inline-mma,fill4-k128-cluster-mma
timeout 120 /tmp/gb/gpu-bench attention --decode-only --shapes 32/32/128,32/8/128 --cases 1024/1,4096/1,16384/1,4096/4,16384/4 --variants $V > $O/attn.jsonl 2> $O/attn.log
echo "attention rc $?"; grep "paged decode" $O/attn.log | sed 's/, rel. err.*//' | cut -c1-150
# 3. Batch-1 decode through the graph, off / on alternated (BROOK_DECODE_CLUSTER).
for L in 128 3800; do for c in 0 1 0 1; do
  BROOK_DECODE_CLUSTER=$c timeout 40 /tmp/gb/gpu-bench decode --quick --model llama-2-7b --input-len $L --output-len 256 >> $O/decode.jsonl 2>> $O/decode.log
  echo "llama-2-7b ctx $L cluster $c rc $?: $(tail -1 $O/decode.jsonl | grep -o '"median_ms":[0-9.]*')"
done; done
