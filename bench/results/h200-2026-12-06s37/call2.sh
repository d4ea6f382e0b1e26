#!/usr/bin/env bash
# Session 37, call 2 (binaries: scripts/gpu-pack.sh .carry/gb37b; carry [".carry/gb37b"]).
# rope_kv, silu_mul and sample launched with PDL (`pdl_small`, BROOK_PDL_SMALL=0|1): tests, then
# decode batch 1 A/B alternated; the decode split's fewest keys (BROOK_DECODE_MIN_KEYS) at 128.
set -u
P=${P:-.carry/gb37b}
mkdir -p /tmp/gb "$OUT/o2" && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 120 /tmp/gb/cuda_kernels rope_kv sample silu > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -5
timeout 170 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -8
run() { # label, then gpu-bench args (env set by the caller)
  local l=$1; shift
  timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for v in 0 1; do BROOK_PDL_SMALL=$v run "pdl_small=$v" decode --quick --model llama-2-7b --output-len 256; done
done
for v in 0 1; do BROOK_PDL_SMALL=$v run "pdl_small=$v" decode --quick --model llama-3-8b --output-len 256; done
for v in 0 1; do BROOK_PDL_SMALL=$v run "pdl_small=$v" decode --quick --model llama-2-7b --input-len 3800 --output-len 256; done
for m in llama-2-7b llama-3-8b; do
  for k in 64 128 0; do BROOK_DECODE_MIN_KEYS=$k run "min_keys=$k" decode --quick --model $m --output-len 256; done
done
timeout 120 /tmp/gb/gpu-bench decode-batch --model llama-2-7b --batch 1 --context 128 --steps 64 --breakdown \
  > $O/bd.jsonl 2> $O/bd.log; echo "breakdown rc $?"; grep "decode batch" $O/bd.log
cd $OUT && tar czf o2.tgz o2 && rm -rf o2
true
