#!/usr/bin/env bash
# Session 36, call 10. NOT RUN (no H200 was lent this session; 104 s of device time were left).
# For the next session, on the H200 (kind nvidia-h200): issue 18's goal figures at this stop's
# code in one call. Binaries: scripts/gpu-pack.sh .carry/gbNN at the stop's HEAD; carry
# [".carry/gbNN"] (set P). About 4 minutes.
set -u
P=${P:-.carry/gb37a}
mkdir -p /tmp/gb "$OUT/o10" && for b in gpu-bench cuda_e2e; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o10
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -5
run() { # args...
  timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$* rc $?: $(grep -o '"median_ms":[0-9.]*\|"output_tok_s":[0-9.]*' $O/d.json | head -3 | tr '\n' ' ')" | tee -a $O/goals.txt
}
for r in 1 2; do
  run decode --quick --model llama-2-7b --output-len 256
  run decode --quick --model llama-2-7b --input-len 3800 --output-len 256
done
run ttft --model llama-2-7b --input-len 2048
run offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128
timeout 60 /tmp/gb/gpu-bench attention --decode-only --shapes 32/32/128,32/8/128 --cases 4096/1,16384/1 \
  --variants fill8-inline,fill8-cluster,fill4-k128-inline-mma,fill4-k128-cluster-mma > $O/attn.jsonl 2> $O/attn.log
echo "attention rc $?"; grep "paged decode" $O/attn.log
true
