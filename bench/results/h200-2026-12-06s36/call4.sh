#!/usr/bin/env bash
# Session 36, call 4 (binaries .carry/gb36c: f006f6b's wide merge + `overlap --sm-targets`;
# carry [".carry/gb36c"]). (1) GEMMs held to part of the SMs (cublasSetSmCountTarget) beside the
# other nano-batch's attention; (2) batch-1 decode, cluster merge against the (now wide) global
# merge, alternated; (3) decode batch 1 at 128 tokens; (4) the lone decode kernel at 4k/16k x 1.
set -u
P=${P:-.carry/gb36c}
mkdir -p /tmp/gb "$OUT/o4" && xz -dc $P/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o4
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/gpu-bench overlap --model llama-2-7b --batch 512 --context 192 --sm-targets 66,88,100,112,124 --reps 3 \
  > $O/overlap.jsonl 2> $O/overlap.log; echo "overlap l2 rc $?"
timeout 150 /tmp/gb/gpu-bench overlap --model llama-3-8b --batch 512 --context 1000 --sm-targets 66,88,100,112 --reps 3 \
  >> $O/overlap.jsonl 2>> $O/overlap.log; echo "overlap l3 rc $?"
grep "overlap .*batch" $O/overlap.log | grep -v allocating | sed 's/, queued.*//'
run() { # label cluster args...
  local l=$1 c=$2; shift 2
  BROOK_DECODE_CLUSTER=$c timeout 45 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/decode.log
  echo "$* | $l rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json)" | tee -a $O/decode.txt
}
for r in 1 2; do
  for M in llama-2-7b llama-3-8b; do
    run global 0 decode --quick --model $M --input-len 3800 --output-len 256
    run cluster 1 decode --quick --model $M --input-len 3800 --output-len 256
  done
  run default 1 decode --quick --model llama-2-7b --output-len 256
done
timeout 60 /tmp/gb/gpu-bench attention --decode-only --shapes 32/32/128,32/8/128 --cases 4096/1,16384/1 \
  --variants fill8-inline,fill8-cluster,fill4-k128-inline-mma,fill4-k128-cluster-mma > $O/attn.jsonl 2> $O/attn.log
echo "attention rc $?"; grep "paged decode" $O/attn.log
true
