#!/usr/bin/env bash
# Session 37, call 5 (binaries: scripts/gpu-pack.sh .carry/gb37e, pdl_small as a mask; carry
# [".carry/gb37e"]). Which of rope_kv (1), silu_mul (2), sample (4) launched with PDL
# (BROOK_PDL_SMALL=mask) wins at batch 1 (128, 3,800 tokens) and batch 2 and 4 (4k).
set -u
P=${P:-.carry/gb37e}
mkdir -p /tmp/gb "$OUT/o5" && for b in gpu-bench; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o5
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # label, then gpu-bench args (env set by the caller)
  local l=$1; shift
  timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
work() { # mask model
  BROOK_PDL_SMALL=$1 run "mask=$1" decode --quick --model $2 --input-len 128 --output-len 256
  BROOK_PDL_SMALL=$1 run "mask=$1" decode --quick --model $2 --input-len 3800 --output-len 256
  for b in 2 4; do BROOK_PDL_SMALL=$1 run "mask=$1" decode-batch --model $2 --batch $b --context 4000 --steps 24; done
}
for k in 0 2 4 6 1 7; do work $k llama-2-7b; done
for k in 0 6; do work $k llama-2-7b; done
for k in 0 6; do work $k llama-3-8b; done
cd $OUT && tar czf o5.tgz o5 && rm -rf o5
true
