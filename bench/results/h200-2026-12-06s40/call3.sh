#!/usr/bin/env bash
# Session 40, call 3 (binaries: .carry/gb40h = 7af147b, as call 2; carry [".carry/gb40h"]): the
# stream floor once more on whatever card comes (the H200's question: is the shipped gemv's one
# launch slower than the ring with every load kept?).
set -u
mkdir -p /tmp/gb "$OUT/o3" || exit 1
xz -dc .carry/gb40h/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 90 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/sf.json 2> $O/sf.log; echo "stream-floor rc $?"
grep -h "one launch\|per matrix\|into " $O/sf.log | head -30
cd $OUT && tar czf o3.tgz o3 && rm -rf o3
true
