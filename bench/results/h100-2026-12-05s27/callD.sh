#!/usr/bin/env bash
# Session 27, call D (carry [".carry/gb27"]; run as one command line): cuda_kernels again with a
# longer limit (call A's run stopped at 150 s), and call C's ncu of decode batch 1 with 16
# decode steps (the first 8 are not timed).
mkdir -p /tmp/gb && for b in cuda_kernels gpu-bench; do xz -dc .carry/gb27/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
timeout 330 /tmp/gb/cuda_kernels --test-threads 1 >"$OUT/cuda_kernels.log" 2>&1; echo "cuda_kernels rc $?"
grep -E "test result|FAILED|panicked" "$OUT/cuda_kernels.log" | head
NCU=/usr/local/cuda/bin/ncu
timeout 150 $NCU --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base /tmp/gb/gpu-bench decode --quick --model llama-2-7b --output-len 16 >"$OUT/ncu_decode_b1.csv" 2>"$OUT/ncu_decode_b1.log"; echo "ncu decode b1 rc $?"
tail -3 "$OUT/ncu_decode_b1.log"
