#!/usr/bin/env bash
# Session 18, call 2: why paged_decode_mma2 (heads as the mma's columns, a third of the products)
# ran at half paged_decode_mma's rate in call 1. ncu (full set, SASS-level stall sampling) of
# one launch of each tensor-core kernel on Llama-3-8B heads at 4k x 256, bf16 and e4m3, and of
# the lane kernel on Llama-2-7B heads at 4k x 1 (issue 18's batch-1 goal).
set -u
R=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
rm -rf /tmp/b; mkdir -p /tmp/b && tar xJf .carry/s18/new.txz -C /tmp/b
B=/tmp/b/s18
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" > $OUT/log.txt
mkdir -p $OUT/ncu
prof() { # name kv shape case variant kernel-regex
  timeout 90 $NCU --clock-control none --set full --import-source no -k regex:"$6" --launch-skip 3 --launch-count 1 -f -o $OUT/ncu/$1 \
    $B/gpu-bench attention --decode-only --kv-cache-dtype $2 --shapes $3 --cases $4 --variants $5 > $OUT/ncu/$1.out 2>&1
  echo "$1 rc $?" >> $OUT/log.txt
  $NCU --import $OUT/ncu/$1.ncu-rep --page details --csv > $OUT/ncu/$1.details.csv 2>&1
  $NCU --import $OUT/ncu/$1.ncu-rep --page source --csv --print-source sass > $OUT/ncu/$1.sass.csv 2>&1
}
prof mma_bf16 bf16 32/8/128 4096/256 fill4-inline-mma '^paged_decode_mma$'
prof mma2_bf16 bf16 32/8/128 4096/256 fill4-inline-mma2 '^paged_decode_mma2$'
prof mma_fp8 fp8 32/8/128 4096/256 fill4-inline-mma '^paged_decode_mma$'
prof mma2_fp8 fp8 32/8/128 4096/256 fill4-inline-mma2 '^paged_decode_mma2$'
prof lanes_b1 bf16 32/32/128 4096/1 fill8-inline '^paged_decode$'
ls -la $OUT/ncu >> $OUT/log.txt
tar czf $OUT/ncu.tgz -C $OUT ncu && rm -rf $OUT/ncu
echo done >> $OUT/log.txt
