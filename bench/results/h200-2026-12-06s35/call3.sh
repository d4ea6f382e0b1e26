#!/usr/bin/env bash
# Session 35, call 3 (call 2's binaries, carry [".carry/gb35a"]): the cluster merge inside the
# decode step, alternated off / on (BROOK_DECODE_CLUSTER), batch 1 at short and long contexts on
# Llama-2-7B (MHA: lane kernel) and Llama-3-8B (GQA 4: tensor-core kernel), and decode-batch at
# batch 4 and 16.
set -u
mkdir -p /tmp/gb "$OUT/o3" && for b in gpu-bench; do
  xz -dc .carry/gb35a/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for ML in llama-2-7b:1000 llama-3-8b:128 llama-3-8b:1000 llama-3-8b:3800 llama-3-8b:7900 llama-2-7b:128 llama-2-7b:3800; do
  M=${ML%%:*}; L=${ML##*:}
  for c in 0 1 0 1; do
    BROOK_DECODE_CLUSTER=$c timeout 45 /tmp/gb/gpu-bench decode --quick --model $M --input-len $L --output-len 256 > $O/d.json 2>> $O/decode.log
    echo "$M ctx $L cluster $c rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json)" | tee -a $O/decode.txt
  done
done
for B in 4 16; do for c in 0 1 0 1; do
  BROOK_DECODE_CLUSTER=$c timeout 45 /tmp/gb/gpu-bench decode-batch --model llama-3-8b --batch $B --context 4000 > $O/d.json 2>> $O/batch.log
  echo "llama-3-8b batch $B ctx 4000 cluster $c rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json)" | tee -a $O/decode.txt
done; done
