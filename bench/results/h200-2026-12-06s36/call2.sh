#!/usr/bin/env bash
# Session 36, call 2 (binaries .carry/gb36a, 7620bcb). Call 1's ncu matched no kernel (NVRTC
# names are paged_decode / paged_decode_mma, without brook's shape suffix) and its kernel tests
# ran out of time. ncu (--set full) of the lone 4k x 1 decode kernel: MHA lanes with the global
# merge (32 splits) and the cluster merge (16), GQA 4 tensor cores with the global merge (64
# splits); then cuda_kernels paged_decode with room to compile its shapes.
set -u
P=${P:-.carry/gb36a}
mkdir -p /tmp/gb "$OUT/o2" && for b in gpu-bench cuda_kernels; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
NCU=/usr/local/cuda/bin/ncu
prof() { # label kernel-regex shape variant
  echo "=== $1" >> $O/ncu.txt
  timeout 120 $NCU --clock-control none --kernel-name "regex:^$2\$" --launch-skip 5 --launch-count 1 \
    --set full /tmp/gb/gpu-bench attention --decode-only --shapes $3 --cases 4096/1 --variants $4 >> $O/ncu.txt 2>&1
  echo "ncu $1 rc $?"
}
prof mha-lanes-inline paged_decode 32/32/128 fill8-inline
prof mha-lanes-cluster paged_decode 32/32/128 fill8-cluster
prof gqa-mma-inline paged_decode_mma 32/8/128 fill4-inline-mma
grep -E "^===|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Waves Per|Theoretical Occ|Warp Cycles Per Issued|Static Shared" $O/ncu.txt | head -60
timeout 240 /tmp/gb/cuda_kernels paged_decode > $O/kernels.log 2>&1; echo "cuda_kernels paged_decode rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -5
true
