#!/usr/bin/env bash
# Session 37, call 9 (binaries: scripts/gpu-pack.sh .carry/gb37g: silu_mul triggers the down
# projection's launch after its pdl_wait; carry [".carry/gb37g"]). BROOK_PDL_SMALL=0 / default
# (SiLU with PDL at 1-2 rows) alternated at batch 1 (128, 3,800) and batch 2 (4k), twice.
set -u
P=${P:-.carry/gb37g}
mkdir -p /tmp/gb "$OUT/o9" && for b in gpu-bench; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o9
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # label, gpu-bench args
  local l=$1; shift
  timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for v in 0 default; do
    if [ $v = 0 ]; then export BROOK_PDL_SMALL=0; else unset BROOK_PDL_SMALL; fi
    run "pdl_small=$v" decode --quick --model llama-2-7b --input-len 128 --output-len 256
    run "pdl_small=$v" decode --quick --model llama-2-7b --input-len 3800 --output-len 256
    run "pdl_small=$v" decode-batch --model llama-2-7b --batch 2 --context 4000 --steps 24
  done
done
unset BROOK_PDL_SMALL
cd $OUT && tar czf o9.tgz o9 && rm -rf o9
true
