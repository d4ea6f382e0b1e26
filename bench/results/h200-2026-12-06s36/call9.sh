#!/usr/bin/env bash
# Session 36, call 9 (run inline on the warm H100 as one command line; binaries .carry/gb36h,
# carry [".carry/gb36h"]): call 8's green-context overlap with CUDA_DEVICE_MAX_CONNECTIONS 32
# and 1 (whether streams sharing hardware queues kept the partitions from overlapping).
P=.carry/gb36h; mkdir -p /tmp/gb $OUT/o9; xz -dc $P/gpu-bench.xz > /tmp/gb/gpu-bench; chmod +x /tmp/gb/gpu-bench
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn BROOK_REQUIRE_GPU=1
for c in 32 1; do
  CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 60 /tmp/gb/gpu-bench overlap --model llama-2-7b --batch 512 --context 192 --green 64 --reps 3 \
    > $OUT/o9/overlap_c$c.jsonl 2> $OUT/o9/overlap_c$c.log
  echo "connections $c rc $?"
  grep -v allocating $OUT/o9/overlap_c$c.log | sed 's/, queued.*//' | grep "two\|one_stream\|green"
done
