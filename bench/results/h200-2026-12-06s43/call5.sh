#!/usr/bin/env bash
# Session 43, call 5: NOT RUN (the session's device time went on refused starts). It tests and
# measures 5b4999a + b4f89df (in main's history, reverted by the commit after them): `ahead`,
# the tensor-core decode kernel prefetching each pass's next keys into L2 (BROOK_DECODE_AHEAD,
# off by default), and the bulk gemv's consumers taking a whole stage inside one row without a
# bounds test and a row choice a step (same sums, same order). To run it: revert the revert,
# pack B with scripts/gpu-pack.sh .carry/gb43d, then pack A the same way with
# kernels/gemv_bulk.cu as in main (git checkout dced55f -- kernels/gemv_bulk.cu) into
# .carry/gb43c; carry [".carry/gb43c", ".carry/gb43d"] (~250 s on the device).
# What it runs: B's gemv kernel tests and cuda_e2e's bulk-gemv and demo-model tests;
# stream-floor of A and B; decode batch 1 alternated; then `ahead` (B, BROOK_DECODE_AHEAD 0|1):
# decode attention alone over an e4m3 cache at 512 x 192 and 4096 x 1, a batch-512 step,
# offline 512 x 128/128 with the e4m3 cache, and its kernel test.
set -u
mkdir -p /tmp/ga /tmp/gbb "$OUT/o5" || exit 1
xz -dc .carry/gb43c/gpu-bench.xz > /tmp/ga/gpu-bench && chmod +x /tmp/ga/gpu-bench || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb43d/$b.xz > /tmp/gbb/$b && chmod +x /tmp/gbb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o5
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 90 /tmp/gbb/cuda_kernels gemv_bulk gemv_matches > $O/kgemv.log 2>&1; echo "cuda_kernels gemv rc $?"
grep -h "test result\|FAILED\|panicked" $O/kgemv.log | head -4
timeout 90 /tmp/gbb/cuda_e2e --test-threads 1 bulk_gemv real_model > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -4
for v in A B; do
  d=/tmp/ga; [ $v = B ] && d=/tmp/gbb
  timeout 40 $d/gpu-bench stream-floor --model llama-2-7b > $O/floor_$v.json 2> $O/floor_$v.log; echo "stream-floor $v rc $?"
  grep "gemv\|ring" $O/floor_$v.log | grep -v "r16\|chain\|tight" | sed "s/^/$v /"
done
run() { # A|B, gpu-bench args
  local v=$1 d=/tmp/ga; shift; [ $v = B ] && d=/tmp/gbb
  timeout 30 $d/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$v | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for v in A B; do
    run $v decode --quick --model llama-2-7b --output-len 256
    [ $r = 1 ] && run $v decode --quick --model llama-3-8b --output-len 256
  done
done
G=/tmp/gbb/gpu-bench
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
timeout 100 /tmp/gbb/cuda_kernels paged_decode_ahead > $O/kahead.log 2>&1; echo "cuda_kernels ahead rc $?"
grep -h "test result\|FAILED\|panicked" $O/kahead.log | head -4
true
