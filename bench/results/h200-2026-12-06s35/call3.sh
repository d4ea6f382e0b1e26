#!/usr/bin/env bash
# Session 35, call 3 (binaries: scripts/gpu-pack.sh .carry/gb35b at the push-merge commit, plus
# gpu-bench-pull = call 2's build (gb35a); carry [".carry/gb35b"]). The cluster merge in two
# forms: "pull" (call 2: each CTA reads its share from every CTA's shared memory between two
# cluster barriers) and "push" (each CTA stores its values into the CTA that merges them, one
# barrier, no CTA waits for its memory to be read). Kernel alone, then inside the decode step.
set -u
mkdir -p /tmp/gb "$OUT/o3" && for b in gpu-bench gpu-bench-pull cuda_e2e cuda_kernels; do
  xz -dc .carry/gb35b/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/cuda_kernels paged_decode_cluster paged_decode_filled paged_decode_inline --test-threads 2 > $O/tests.log 2>&1; echo "cuda_kernels rc $?"
timeout 60 /tmp/gb/cuda_e2e cluster --test-threads 1 >> $O/tests.log 2>&1; echo "cuda_e2e cluster rc $?"
grep -h "test result\|FAILED\|panicked" $O/tests.log | head -10
V=fill8-inline,fill8-cluster,fill4-k128-inline-mma,fill4-k128-cluster-mma
for b in gpu-bench-pull gpu-bench; do
  timeout 90 /tmp/gb/$b attention --decode-only --shapes 32/32/128,32/8/128 --cases 1024/1,4096/1,16384/1,4096/16 --variants $V > $O/attn_$b.jsonl 2> $O/attn_$b.log
  echo "$b attention rc $?"; grep "paged decode" $O/attn_$b.log | grep -v "inline" | sed 's/, rel. err.*//' | cut -c15-150
done
grep "paged decode" $O/attn_gpu-bench.log | grep "inline" | sed 's/, rel. err.*//' | cut -c15-150
run() { # label binary cluster args...
  local l=$1 b=$2 c=$3; shift 3
  BROOK_DECODE_CLUSTER=$c timeout 45 /tmp/gb/$b "$@" > $O/d.json 2>> $O/decode.log
  echo "$* | $l rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json)" | tee -a $O/decode.txt
}
for r in 1 2; do
  for ML in llama-2-7b:128 llama-2-7b:3800 llama-3-8b:128 llama-3-8b:1000 llama-3-8b:3800 llama-3-8b:7900; do
    M=${ML%%:*}; L=${ML##*:}
    run off gpu-bench 0 decode --quick --model $M --input-len $L --output-len 256
    run pull gpu-bench-pull 1 decode --quick --model $M --input-len $L --output-len 256
    run push gpu-bench 1 decode --quick --model $M --input-len $L --output-len 256
  done
  [ $r = 1 ] && for B in 4 16; do
    run off gpu-bench 0 decode-batch --model llama-3-8b --batch $B --context 4000
    run pull gpu-bench-pull 1 decode-batch --model llama-3-8b --batch $B --context 4000
    run push gpu-bench 1 decode-batch --model llama-3-8b --batch $B --context 4000
  done
done
