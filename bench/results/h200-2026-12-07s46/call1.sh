#!/usr/bin/env bash
# RAN in session 46 at ~08:04 UTC on an H100 80GB HBM3, not the H200 (bench/results/h100-2026-12-07s46/o1).
# Session 46: session 45's H200 call (bench/results/h200-2026-12-07s45/call1.sh) plus offline
# 512 x 128/128 A/B with the bf16 and e4m3 caches. Same packs, same carry.
# Packs (scripts/gpu-pack.sh): .carry/gb45 = main (tensor-core dots, GB_MMA 1);
# .carry/gb44a = gpu-bench at 580b9d3 (scalar dots).
# carry [".carry/gb44a", ".carry/gb45"]. Runs: the gemv kernel tests; stream-floor (scalar and
# tensor-core dots in one binary); decode batch 1 A/B alternated (Llama-2-7B x3, Llama-3-8B x2);
# decode-batch at batch 2 and 4 A/B; the whole cuda_e2e suite on B. Outputs under $OUT/o1.
set -u
mkdir -p /tmp/ga /tmp/gb "$OUT/o1" || exit 1
xz -dc .carry/gb44a/gpu-bench.xz > /tmp/ga/gpu-bench && chmod +x /tmp/ga/gpu-bench || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb45/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
# With H200_ONLY=1 (call2.sh; added after call 1, which ran without it): on any card but an H200
# only the deep ring against the tight one under the tensor-core dots (the deep ring won with
# scalar dots, session 41), then stop; on an H200 that timing runs after the A/B.
smem() { for r in 1 2; do for s in tight deep; do
  BROOK_GEMV_SMEM=$s timeout 40 /tmp/gb/gpu-bench decode --quick --model llama-2-7b --output-len 256 > $O/d.json 2>> $O/bench.log
  echo "B $s | decode b1 L2-7B rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/smem.txt
done; done; }
[ "${H200_ONLY:-0}" = 1 ] && ! grep -q H200 $O/gpu.txt && { echo "not an H200"; smem; exit 0; }
timeout 150 /tmp/gb/cuda_kernels gemv > $O/kgemv.log 2>&1; echo "cuda_kernels gemv rc $?"
grep -h "test result\|FAILED\|panicked" $O/kgemv.log | head -6
timeout 60 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.json 2> $O/floor.log; echo "stream-floor rc $?"
grep "gemv\|ring\|matches" $O/floor.log | grep -v "r16\|chain" | head -24
run() { # A|B, gpu-bench args
  local v=$1 d=/tmp/ga; shift; [ $v = B ] && d=/tmp/gb
  timeout 40 $d/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$v | $* rc $?: $(grep -o '"median_ms":[0-9.]*\|"median_decode_step_ms":[0-9.]*\|"median_step_ms":[0-9.]*' $O/d.json | head -2 | tr '\n' ' ')" | tee -a $O/ab.txt
}
for r in 1 2 3; do
  for v in A B; do
    run $v decode --quick --model llama-2-7b --output-len 256
    [ $r != 3 ] && run $v decode --quick --model llama-3-8b --output-len 256
  done
done
for v in A B; do
  for b in 2 4; do run $v decode-batch --model llama-2-7b --batch $b --context 512 --steps 24; done
done
for v in A B; do d=/tmp/ga; [ $v = B ] && d=/tmp/gb
  timeout 90 $d/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype bf16,fp8 > $O/off$v.json 2>> $O/off.log; echo "offline $v rc $?: $(grep -o "\"output_tok_s\":[0-9.]*" $O/off$v.json | tr "\n" " ")" | tee -a $O/ab.txt
done
[ "${H200_ONLY:-0}" = 1 ] && smem
timeout 200 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
true
