#!/usr/bin/env bash
# RAN in session 45 (2026-12-07 04:26 UTC) on an H100 80GB HBM3: bench/results/h100-2026-12-07s45.
# NOT RUN in session 44: every start was refused or held off (BENCHMARKS.md, session 44). The
# code it measures is 923fcf5, reverted by the commit after it. To run it: `git checkout 923fcf5
# -- kernels src tests`, `scripts/gpu-pack.sh .carry/gb44d`; for .carry/gb44c the same with
# kernels/gemv_bulk.cu's row tracking undone (SHORT=1 leaves C out); .carry/gb44a = gpu-bench built
# at 580b9d3 (any commit with the scalar dots), packed as gpu-pack.sh does.
# Session 44, call 1. Packs (scripts/gpu-pack.sh): .carry/gb44c = the tree with the bulk gemv's
# dots on tensor cores (GB_MMA 1, gb_mma_stage) and `ahead` (session 43's 5b4999a + b4f89df,
# BROOK_DECODE_AHEAD, off by default); .carry/gb44d = gb44c with the row a stage starts in
# carried from stage to stage (no division a stage); .carry/gb44a = main at 580b9d3 (scalar
# dots, no `ahead`; gpu-bench only). carry [".carry/gb44a", ".carry/gb44c", ".carry/gb44d"].
# Runs (D unless named): the gemv kernel tests; stream-floor (its `gemv scalar dots` builds are
# A's dots in the same binary); decode batch 1 A/D alternated (C once); decode-batch at batch 2
# and 4 (the m = 2 and 4 kernels) A/D; the cuda_e2e tests that run the gemv path; then `ahead`
# (D, BROOK_DECODE_AHEAD 0|1) as session 43's call5.sh: decode attention alone over an e4m3
# cache, a batch-512 step, offline 512 x 128/128 with the e4m3 cache, and its kernel test.
# SHORT=1 bash call1.sh (~150 s, carry [".carry/gb44a", ".carry/gb44d"]) stops after the
# cuda_e2e tests and leaves out C.
set -u
mkdir -p /tmp/ga /tmp/gc /tmp/gd "$OUT/o1" || exit 1
xz -dc .carry/gb44a/gpu-bench.xz > /tmp/ga/gpu-bench && chmod +x /tmp/ga/gpu-bench || exit 1
SHORT=${SHORT:-0}
if [ "$SHORT" = 0 ]; then
  xz -dc .carry/gb44c/gpu-bench.xz > /tmp/gc/gpu-bench && chmod +x /tmp/gc/gpu-bench || exit 1
fi
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb44d/$b.xz > /tmp/gd/$b && chmod +x /tmp/gd/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gd/cuda_kernels gemv > $O/kgemv.log 2>&1; echo "cuda_kernels gemv rc $?"
grep -h "test result\|FAILED\|panicked" $O/kgemv.log | head -6
timeout 60 /tmp/gd/gpu-bench stream-floor --model llama-2-7b > $O/floor.json 2> $O/floor.log; echo "stream-floor rc $?"
grep "gemv\|ring\|matches" $O/floor.log | grep -v "r16\|chain" | head -24
run() { # A|C|D, gpu-bench args
  local v=$1 d=/tmp/ga; shift; [ $v = C ] && d=/tmp/gc; [ $v = D ] && d=/tmp/gd
  timeout 40 $d/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$v | $* rc $?: $(grep -o '"median_ms":[0-9.]*\|"median_decode_step_ms":[0-9.]*\|"median_step_ms":[0-9.]*' $O/d.json | head -2 | tr '\n' ' ')" | tee -a $O/ab.txt
}
for r in 1 2; do
  for v in A D; do
    run $v decode --quick --model llama-2-7b --output-len 256
    [ $r = 1 ] && run $v decode --quick --model llama-3-8b --output-len 256
    [ $r = 1 ] && [ $v = D ] && [ "$SHORT" = 0 ] && run C decode --quick --model llama-2-7b --output-len 256
  done
done
timeout 150 /tmp/gd/cuda_e2e --test-threads 1 bulk_gemv small_batches_on_gemv real_model > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
# SHORT=1: what decides the tensor-core dots, for a start with little device time left.
[ "$SHORT" = 1 ] && exit 0
for v in A D; do
  for b in 2 4; do run $v decode-batch --model llama-2-7b --batch $b --context 512 --steps 24; done
done
G=/tmp/gd/gpu-bench
timeout 60 $G attention --decode-only --shapes 32/32/128 --cases 192/512,4096/1 --variants fill6-inline-mma,fill6-inline-mma-ahead,fill4-k128-cluster-mma,fill4-k128-cluster-mma-ahead --kv-cache-dtype fp8 > $O/att.json 2> $O/att.log; echo "attention rc $?"
grep -h "paged decode" $O/att.log | sed 's/, rel. err.*//'
step() { # ahead, then gpu-bench args
  local a=$1; shift
  BROOK_DECODE_AHEAD=$a timeout 40 $G "$@" > $O/s.json 2>> $O/steps.log
  echo "ahead $a | $* rc $?: $(grep -o '"median_ms":[0-9.]*\|"output_tok_s":[0-9.]*\|"median_decode_step_ms":[0-9.]*' $O/s.json | tr '\n' ' ')" | tee -a $O/ab.txt
}
for a in 0 1; do
  step $a decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8
done
for a in 0 1; do
  step $a offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8
done
timeout 100 /tmp/gd/cuda_kernels paged_decode_ahead > $O/kahead.log 2>&1; echo "cuda_kernels ahead rc $?"
grep -h "test result\|FAILED\|panicked" $O/kahead.log | head -4
true
