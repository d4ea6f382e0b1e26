#!/usr/bin/env bash
# Session 37, call 8 (binaries: .carry/gb37f; carry [".carry/gb37f"]): TTFT 2048 rested, offline
# 300 x 1000/1000, and SiLU's PDL at batch 1 alternated twice more (BROOK_PDL_SMALL=0 / default).
set -u
P=${P:-.carry/gb37f}
mkdir -p /tmp/gb "$OUT/o8" && for b in gpu-bench; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o8
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # label, gpu-bench args
  local l=$1; shift
  timeout 150 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*\|"output_tok_s":[0-9.]*' $O/d.json | head -3 | tr '\n' ' ')" | tee -a $O/goals.txt
}
run - ttft --model llama-2-7b --input-len 2048 --gap-ms 300
for r in 1 2; do
  BROOK_PDL_SMALL=0 run pdl_small=0 decode --quick --model llama-2-7b --output-len 256
  run pdl_small=default decode --quick --model llama-2-7b --output-len 256
done
run - offline --model llama-2-7b --num-prompts 300 --input-len 1000 --output-len 1000
cd $OUT && tar czf o8.tgz o8 && rm -rf o8
true
