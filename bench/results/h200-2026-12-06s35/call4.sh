#!/usr/bin/env bash
# Session 35, call 4 (binaries: scripts/gpu-pack.sh .carry/gb35c: the push merge, the one-wave
# rule, decode_cluster on by default; carry [".carry/gb35c"]). cuda_e2e whole with the new
# default; then the rule at batch 2-16 (decode-batch at 4k tokens), off / on alternated.
set -u
mkdir -p /tmp/gb "$OUT/o4" && for b in gpu-bench cuda_e2e; do
  xz -dc .carry/gb35c/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/tests.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/tests.log | head -10
run() { # label cluster args...
  local l=$1 c=$2; shift 2
  BROOK_DECODE_CLUSTER=$c timeout 45 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/decode.log
  echo "$* | $l rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json)" | tee -a $O/decode.txt
}
for r in 1 2; do
  for MB in llama-2-7b:2 llama-2-7b:4 llama-2-7b:8 llama-3-8b:2 llama-3-8b:4 llama-3-8b:16; do
    M=${MB%%:*}; B=${MB##*:}
    run off 0 decode-batch --model $M --batch $B --context 4000
    run on 1 decode-batch --model $M --batch $B --context 4000
  done
  run off 0 decode --quick --model llama-2-7b --input-len 3800 --output-len 256
  run on 1 decode --quick --model llama-2-7b --input-len 3800 --output-len 256
done
true
