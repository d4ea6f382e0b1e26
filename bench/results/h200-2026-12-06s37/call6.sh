#!/usr/bin/env bash
# Session 37, call 6 (binaries: scripts/gpu-pack.sh .carry/gb37f: pdl_small = SiLU at 1-2 rows by
# default; carry [".carry/gb37f"]). Tests, then the default against BROOK_PDL_SMALL=0 at
# batch 1 (128, 3,800), 2, 3 and 4 (4k), alternated twice on Llama-2-7B, once on Llama-3-8B.
set -u
P=${P:-.carry/gb37f}
mkdir -p /tmp/gb "$OUT/o6" && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o6
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 100 /tmp/gb/cuda_kernels rope_kv sample silu > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -5
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -8
run() { # label, then gpu-bench args (env set by the caller)
  local l=$1; shift
  timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
work() { # model
  for v in 0 default; do
    if [ $v = 0 ]; then export BROOK_PDL_SMALL=0; else unset BROOK_PDL_SMALL; fi
    run "pdl_small=$v" decode --quick --model $1 --input-len 128 --output-len 256
    run "pdl_small=$v" decode --quick --model $1 --input-len 3800 --output-len 256
    for b in 2 3 4; do run "pdl_small=$v" decode-batch --model $1 --batch $b --context 4000 --steps 24; done
    unset BROOK_PDL_SMALL
  done
}
work llama-2-7b; work llama-2-7b; work llama-3-8b
cd $OUT && tar czf o6.tgz o6 && rm -rf o6
true
