#!/usr/bin/env bash
# Session 33, the one-line call right after call 3 on the same warm H100 (as sent to the device,
# one line; kept here for the record): gpu-bench offline 512 x 128/128 (call 3 lost its log to
# the limit on files that come back), and one `brook bench` at 64 x 128/128 with RUST_BACKTRACE
# and dmesg's last lines (the exit crash).
cd /tmp/gb 2>/dev/null && ls >/dev/null; export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn BROOK_REQUIRE_GPU=1; mkdir -p $OUT/o4; printf '[scheduler]\nprewake_us = 300\n' > /tmp/pw300.toml; timeout 40 /tmp/gb/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 > $OUT/o4/offline.jsonl 2> $OUT/o4/offline.log; tail -4 $OUT/o4/offline.log; grep -h "output tok\|Segm" /work/.device/19/o3/b512.log 2>/dev/null; RUST_BACKTRACE=1 timeout 50 /tmp/gb/brook-own bench --synthetic llama-2-7b --device cuda --config /tmp/pw300.toml --num-prompts 64 --input-len 128 --output-len 128 > $OUT/o4/b64.log 2>&1; echo "rc $?"; tail -12 $OUT/o4/b64.log; dmesg 2>/dev/null | tail -3
