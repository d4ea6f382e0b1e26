#!/usr/bin/env bash
# NOT RUN: no machine could be started while it was current; folded into call3.sh, which ran.
# Session 33's second GPU call (same carry as call1.sh): the serving path with lookahead through
# the actors at batch 1, a batched serving run with pre-wake off and on, and gpu-bench
# stream-floor (gpu-bench rebuilt at session 33's second commit).
set -u
mkdir -p /tmp/gb /tmp/o2 && xz -dc .carry/gb32/brook.xz > /tmp/gb/brook && chmod +x /tmp/gb/brook
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=/tmp/o2
trap 'tar czf "$OUT/call2.tgz" -C /tmp o2' EXIT
printf '[scheduler]\nprewake_us = 0\n' > $O/pw0.toml; printf '[scheduler]\nprewake_us = 300\n' > $O/pw300.toml
B="/tmp/gb/brook bench --synthetic llama-2-7b --device cuda"
for c in "pw300 auto" "pw300 on" "pw0 auto" "pw300 off"; do
  set -- $c
  echo "== $1 lookahead $2" >> $O/itl-la.log
  timeout 100 $B --config $O/$1.toml --cuda-lookahead $2 --num-prompts 1 --input-len 128 --output-len 512 >> $O/itl-la.log 2>&1
done
grep "==\|ITL\|out tok\|executor" $O/itl-la.log
for c in pw0 pw300 pw0 pw300; do
  echo "== $c" >> $O/b512.log
  timeout 100 $B --config $O/$c.toml --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192 >> $O/b512.log 2>&1
done
grep "==\|ITL\|out tok\|executor\|rror" $O/b512.log
xz -dc .carry/gb32/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench
# The same workload on the backend alone (brook's scheduler, no actors), for the actors' share.
timeout 100 /tmp/gb/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 > $O/offline.jsonl 2> $O/offline.log
grep -i "out tok\|rror" $O/offline.log | tail -3
timeout 120 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
grep "stream floor\|rror" $O/floor.log
