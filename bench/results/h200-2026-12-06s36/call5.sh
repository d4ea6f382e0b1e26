#!/usr/bin/env bash
# Session 36, call 5 (.carry/gb36e: gpu-bench with `overlap --sm-targets` and its
# attention_only_onN, a hog kernel holding the other SMs; ld_cg16 moved to common.cuh, so the
# merge and gemv_chain tests run first; carry [".carry/gb36e"]). Whether the GPU could be split between
# a nano-batch's GEMMs and the other's attention: GEMM time on X SMs, attention time on N SMs.
set -u
P=${P:-.carry/gb36e}
mkdir -p /tmp/gb "$OUT/o5" && for b in gpu-bench cuda_kernels; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o5
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/cuda_kernels paged_decode_inline_merge paged_decode_filled_splits gemv_chain > $O/tests.log 2>&1
echo "cuda_kernels rc $?"; grep -h "test result\|FAILED\|panicked" $O/tests.log | head -5
timeout 200 /tmp/gb/gpu-bench overlap --model llama-2-7b --batch 512 --context 192 --sm-targets 44,66,88 --reps 3 \
  > $O/overlap.jsonl 2> $O/overlap.log; echo "overlap l2 rc $?"
timeout 200 /tmp/gb/gpu-bench overlap --model llama-3-8b --batch 512 --context 1000 --sm-targets 66 --reps 3 \
  >> $O/overlap.jsonl 2>> $O/overlap.log; echo "overlap l3 rc $?"
grep "overlap .*batch" $O/overlap.log | grep -v allocating | sed 's/, queued.*//'
true
