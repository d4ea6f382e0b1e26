#!/usr/bin/env bash
# Session 35, call 6. NOT RUN (no device time left). For the next session: where the isolated
# decode kernel's ~12 us of fixed cost at 4k x 1 goes (Llama-2-7B heads, the lane kernel), under
# ncu, with the global merge (fill8-inline, 32 splits) and the cluster merge (fill8-cluster, 16).
# Binaries: scripts/gpu-pack.sh .carry/gbNN; carry [".carry/gbNN"] (set P below).
set -u
P=${P:-.carry/gb35d}
mkdir -p /tmp/gb "$OUT/o6" && xz -dc $P/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o6
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in fill8-inline fill8-cluster; do
  timeout 200 $NCU --clock-control none --kernel-name regex:paged_decode_hd128 --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section SchedulerStats --section WarpStateStats \
    /tmp/gb/gpu-bench attention --decode-only --shapes 32/32/128 --cases 4096/1 --variants $v > $O/ncu_$v.txt 2>&1
  echo "ncu $v rc $?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Registers|Achieved Occupancy|Waves|Issue Slots|No Eligible|Stall|Warp Cycles" $O/ncu_$v.txt | head -30
done
