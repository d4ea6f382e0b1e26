#!/usr/bin/env bash
# Session 37, call 4 (binaries: scripts/gpu-pack.sh .carry/gb37d at da1c503, pdl_small on by
# default; carry [".carry/gb37d"]). cuda_e2e on the new default; pdl_small at batch 2 and 4
# (decode-batch, 4k tokens); the cluster merge under the new default; the batch-1 breakdown.
set -u
P=${P:-.carry/gb37d}
mkdir -p /tmp/gb "$OUT/o4" && for b in gpu-bench cuda_e2e; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 170 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -8
run() { # label, then gpu-bench args (env set by the caller)
  local l=$1; shift
  timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*\|"ms_per_step":[0-9.]*' $O/d.json | head -1) $(grep -o 'a step ([^)]*' $O/bench.log | tail -1)" | tee -a $O/ab.txt
}
for r in 1 2; do
  for m in llama-2-7b llama-3-8b; do
    for b in 2 4; do
      for v in 0 1; do BROOK_PDL_SMALL=$v run "pdl_small=$v" decode-batch --model $m --batch $b --context 4000 --steps 24; done
    done
  done
done
for m in llama-2-7b llama-3-8b; do
  for L in 128 3800; do
    for c in 0 1; do BROOK_DECODE_CLUSTER=$c run "cluster=$c" decode --quick --model $m --input-len $L --output-len 256; done
  done
done
timeout 120 /tmp/gb/gpu-bench decode-batch --model llama-2-7b --batch 1 --context 128 --steps 64 --breakdown \
  > $O/bd.jsonl 2> $O/bd.log; echo "breakdown rc $?"; grep "decode batch" $O/bd.log
cd $OUT && tar czf o4.tgz o4 && rm -rf o4
true
