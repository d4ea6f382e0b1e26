#!/usr/bin/env bash
# Session 42, call 1 (binaries: scripts/gpu-pack.sh .carry/gb42a = the commit folding RoPE into
# decode attention, BROOK_DECODE_ROPE, off by default; carry [".carry/gb42a"]). Its kernel tests;
# then decode A/B: rope_kv + attention (off), RoPE folded in (on), folded and launched with PDL
# (onpdl: BROOK_PDL_SMALL=3), alternated twice; then cuda_e2e's fold, cluster, bulk and demo-model
# tests (the fold is off by default: the rest run unchanged paths).
set -u
mkdir -p /tmp/gb "$OUT/o1" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb42a/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/cuda_kernels paged_decode rope_kv > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -8
run() { # variant (off | on | onpdl | tight | deep), then gpu-bench args
  local t=$1 rope=1 pdl=2 smem=deep; shift
  [ $t = off ] && rope=0
  [ $t = onpdl ] && pdl=3
  case $t in tight|deep) rope=0; smem=$t ;; esac
  BROOK_DECODE_ROPE=$rope BROOK_PDL_SMALL=$pdl BROOK_GEMV_SMEM=$smem timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for t in off on onpdl; do
    run $t decode --quick --model llama-2-7b --output-len 256
    run $t decode --quick --model llama-3-8b --output-len 256
    run $t decode --quick --model llama-2-7b --input-len 3800 --output-len 256
    run $t decode-batch --model llama-2-7b --batch 2 --context 4000 --steps 24
    run $t decode-batch --model llama-3-8b --batch 4 --context 4000 --steps 24
  done
done
timeout 100 /tmp/gb/cuda_e2e --test-threads 1 rope_in_decode cluster_merged bulk_gemv real_model > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
cd $OUT && tar czf o1.tgz o1 && rm -rf o1
true
