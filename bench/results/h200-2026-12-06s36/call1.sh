#!/usr/bin/env bash
# Session 36, call 1 (binaries: scripts/gpu-pack.sh .carry/gb36a at 7620bcb; carry [".carry/gb36a"]).
# 7620bcb's launch-attribute helpers checked (decode kernel tests, cuda_e2e); decode batch 1 with
# the cluster merge by default; the lone 4k x 1 and 16k x 1 decode kernels timed, then under ncu
# (session 35's call6.sh): where the ~16 us of fixed cost goes.
set -u
P=${P:-.carry/gb36a}
mkdir -p /tmp/gb "$OUT/o1" && for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 60 /tmp/gb/cuda_kernels paged_decode > $O/kernels.log 2>&1; echo "cuda_kernels paged_decode rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -5
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -10
for r in 1 2; do
  timeout 45 /tmp/gb/gpu-bench decode --quick --model llama-2-7b --output-len 256 > $O/d.json 2>> $O/decode.log
  echo "decode b1 l2-7b 128 (cluster default) rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json)" | tee -a $O/decode.txt
done
timeout 90 /tmp/gb/gpu-bench attention --decode-only --shapes 32/32/128,32/8/128 --cases 4096/1,16384/1 \
  --variants fill8-inline,fill8-cluster,fill4-inline-mma,fill4-cluster-mma > $O/attn.jsonl 2> $O/attn.log
echo "attention rc $?"; cat $O/attn.jsonl | cut -c1-400
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
for v in fill8-inline fill8-cluster; do
  timeout 150 $NCU --clock-control none --kernel-name regex:paged_decode_hd128 --launch-skip 5 --launch-count 1 \
    --set full /tmp/gb/gpu-bench attention --decode-only --shapes 32/32/128 --cases 4096/1 --variants $v > $O/ncu_$v.txt 2>&1
  echo "ncu $v rc $?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Waves Per|Block Limit|L2 Hit|Stall|Warp Cycles Per Issued" $O/ncu_$v.txt | head -24
done
true
