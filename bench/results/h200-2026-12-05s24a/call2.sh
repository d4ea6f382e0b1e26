#!/usr/bin/env bash
# Session 24, call 2: session 22's four bulk-gemv switches removed (they lost in call 1, and their
# code made the default 3.83 ms against 665908a's 3.71): every GPU test suite, then bulk18
# (decode batch 1 on Llama-2-7B and Llama-3-8B alternated with 665908a's gpu-bench), TTFT 2048
# and offline 512x128/128 for the record.
# Carry: .carry/pack24 (tar cJf of .carry/cuda and .carry/before665)
tar xJf .carry/pack24/p.txz -C .carry || exit 1
cd .carry/cuda || exit 1
./gpu-check.sh device tests
BEFORE=$PWD/../before665 ./gpu-check.sh device bulk18
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache
timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >"$OUT/ttft.jsonl" 2>"$OUT/ttft.log"
timeout 120 ./gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 >"$OUT/offline.jsonl" 2>"$OUT/offline.log"
tail -3 "$OUT/ttft.log" "$OUT/offline.log"
