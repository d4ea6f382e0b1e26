#!/usr/bin/env bash
# Session 37, call 3 (binaries: scripts/gpu-pack.sh .carry/gb37c: rope_kv triggers attention's
# launch after its pdl_wait; carry [".carry/gb37c"]). BROOK_PDL_SMALL=0|1 alternated twice at
# 128 and 3,800 tokens, both models; the rope/silu/sample kernel tests.
set -u
P=${P:-.carry/gb37c}
mkdir -p /tmp/gb "$OUT/o3" && for b in gpu-bench cuda_kernels; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 120 /tmp/gb/cuda_kernels rope_kv sample silu > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -5
run() { # label, then gpu-bench args (env set by the caller)
  local l=$1; shift
  timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for m in llama-2-7b llama-3-8b; do
    for L in 128 3800; do
      for v in 0 1; do BROOK_PDL_SMALL=$v run "pdl_small=$v" decode --quick --model $m --input-len $L --output-len 256; done
    done
  done
done
cd $OUT && tar czf o3.tgz o3 && rm -rf o3
true
