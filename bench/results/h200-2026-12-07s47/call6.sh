#!/usr/bin/env bash
# NOT RUN: its start in session 47 (12:00 UTC) was refused, and then too little device time was left.
# Session 47, call 6 and later: the smallest H200 measurement, for a device budget too short for
# call3.sh. On any card but an H200 it stops after nvidia-smi. On an H200: decode batch 1,
# Llama-2-7B, scalar dots (.carry/gb44a) against main's tensor-core dots (.carry/gb45), two
# alternated rounds; then decode attention alone at 192 x 512 on the e4m3 cache, main before
# this session (DMMA_BT_AHEAD=0) against now (.carry/gb47). Everything to stdout.
# carry [".carry/gb44a", ".carry/gb45", ".carry/gb47"].
set -u
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee /tmp/gpu.txt
grep -q H200 /tmp/gpu.txt || { echo "not an H200: stop"; exit 0; }
mkdir -p /tmp/g
for p in gb44a gb45 gb47; do xz -dc .carry/$p/gpu-bench.xz > /tmp/g/$p && chmod +x /tmp/g/$p || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
for r in 1 2; do for p in gb44a gb45; do
  timeout 40 /tmp/g/$p decode --quick --model llama-2-7b --output-len 256 > /tmp/d.json 2> /tmp/d.log
  echo "$p | decode b1 llama-2-7b rc $?: $(grep -o '"median_ms":[0-9.]*' /tmp/d.json | head -1)"
done; done
for d in DMMA_BT_AHEAD=0 ""; do
  BROOK_DECODE_DEFINES=$d timeout 40 /tmp/g/gb47 attention --decode-only --shapes 32/32/128 --cases 192/512 \
    --kv-cache-dtype fp8 --variants default,fill6-inline-mma > /dev/null 2> /tmp/a.log
  echo "gb47 [$d] attention rc $?: $(grep -h "fill6" /tmp/a.log | sed 's/^.*paged decode //')"
done
