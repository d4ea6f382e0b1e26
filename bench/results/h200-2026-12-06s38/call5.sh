#!/usr/bin/env bash
# Session 38, call 5 (binaries .carry/gb38e: main after the fused projection was set aside, the
# lane decode kernel reading its first K/V rows before pdl_wait (`early_keys`); carry
# [".carry/gb38e", ".carry/gb37l"]): decode kernel and e2e tests, then batch-1 decode of
# Llama-2-7B (the lane kernel's model) and the lone kernel, against the baseline build.
set -u
mkdir -p /tmp/gb /tmp/base "$OUT/o5" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb38e/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb37l/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o5
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # label, binary, gpu-bench args
  local l=$1 b=$2; shift 2
  timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/decode.txt
}
for r in 1 2; do
  for ctx in 128 3800; do
    run base /tmp/base/gpu-bench decode --quick --model llama-2-7b --input-len $ctx --output-len 256
    run new /tmp/gb/gpu-bench decode --quick --model llama-2-7b --input-len $ctx --output-len 256
  done
done
for b in base gb; do
  timeout 60 /tmp/$b/gpu-bench attention --decode-only --shapes 32/32/128 --cases 128/1,4096/1,4096/16 --variants fill8-inline,fill8-cluster > $O/attn_$b.json 2> $O/attn_$b.log
  echo "attention $b rc $?"; grep -o "paged decode .*splits" $O/attn_$b.log | sed 's/, rel. err.*//'
done
timeout 120 /tmp/gb/cuda_e2e --test-threads 2 mha_hd128 gqa_hd64 cluster_merged small_batches > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -4
timeout 240 /tmp/gb/cuda_kernels paged_decode_inline paged_decode_filled paged_decode_cluster paged_decode_mha paged_decode_sliding paged_decode_block_sizes paged_decode_fp8_batches > $O/kernels.log 2>&1; echo "cuda_kernels paged_decode rc $?"
grep -h "^test \|test result\|panicked" $O/kernels.log | head -10
cd $OUT && tar czf o5.tgz o5 && rm -rf o5
true
