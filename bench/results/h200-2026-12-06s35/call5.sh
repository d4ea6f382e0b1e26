#!/usr/bin/env bash
# Session 35, call 5 (binaries: scripts/gpu-pack.sh .carry/gb35d: the cluster merge where the
# grid fills at most half a wave, on by default; carry [".carry/gb35d"]): batch-1 decode off / on
# alternated on both models at 128 and 3.8k tokens; Llama-2-7B at batch 2 and 4 (now off by the
# rule: both runs the same path); cuda_e2e's cluster test.
set -u
mkdir -p /tmp/gb "$OUT/o5" && for b in gpu-bench cuda_e2e; do
  xz -dc .carry/gb35d/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o5
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 40 /tmp/gb/cuda_e2e cluster --test-threads 1 > $O/tests.log 2>&1; echo "cuda_e2e cluster rc $?"
grep -h "test result\|FAILED\|panicked" $O/tests.log | head -5
run() { # label cluster args...
  local l=$1 c=$2; shift 2
  BROOK_DECODE_CLUSTER=$c timeout 45 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/decode.log
  echo "$* | $l rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json)" | tee -a $O/decode.txt
}
for r in 1 2; do
  for ML in llama-2-7b:128 llama-2-7b:3800 llama-3-8b:128 llama-3-8b:3800; do
    M=${ML%%:*}; L=${ML##*:}
    run off 0 decode --quick --model $M --input-len $L --output-len 256
    run on 1 decode --quick --model $M --input-len $L --output-len 256
  done
done
for B in 2 4; do
  run off 0 decode-batch --model llama-2-7b --batch $B --context 4000
  run on 1 decode-batch --model llama-2-7b --batch $B --context 4000
done
