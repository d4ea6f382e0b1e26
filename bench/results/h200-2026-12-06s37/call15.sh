#!/usr/bin/env bash
# Session 37, call 15 (gpu-bench of the review mend: .carry/gb37l; carry [".carry/gb37l"]): the
# stream floor with the tight variant on the kernel Gpu::open loaded, outputs checked.
set -u
mkdir -p /tmp/gb "$OUT/o15" && xz -dc .carry/gb37l/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o15
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 90 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
echo "stream-floor rc $?"; grep "stream floor" $O/floor.log | grep -v "chain\|ring" | sed 's/ for .* launches,/:/'
cd $OUT && tar czf o15.tgz o15 && rm -rf o15
true
