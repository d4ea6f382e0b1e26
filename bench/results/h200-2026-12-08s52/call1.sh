#!/usr/bin/env bash
# Session 52, call 1: session 51's call1.sh (the copy floor on any card; on an H200 session 50's
# call: decode batch 1 scalar against tensor-core gemv dots, the e4m3 ring A/B, offline bf16,
# cuda_e2e) with this session's build, then a KV block-size A/B (BROOK_BLOCK_SIZE, new in
# gpu-bench): a kv head's block is 2 KB of contiguous e4m3 cache at 16 keys, 4 KB at 32. Decode
# attention (the serving rule) at 192 x 512, 1000 x 512, 4k x 1 and 4k x 16, both caches, and on
# an H200 offline 512 x 128/128 with the e4m3 cache, blocks of 16 against 32. Also the e4m3
# kernel at 5 CTAs an SM (DMMA_CTAS_SET=5: 96 registers, 44 bytes spilled outside the loop)
# against 4 (119): more of the cache in flight at short contexts.
# carry [".carry/gb52", ".carry/gb44a"] (gb52: scripts/gpu-pack.sh at 0f4819f).
# About 450 s on an H200 (SKIP_E2E=1: ~390), ~250 s elsewhere. QUICK=1 (one round of session
# 51's call, no tests, the e4m3 block-size runs only, no offline): ~240 s.
set -u
sed 's#\.carry/gb51/#.carry/gb52/#' bench/results/h200-2026-12-07s51/call1.sh > /tmp/s51.sh
bash /tmp/s51.sh
O=$OUT/bs; mkdir -p $O
G=/tmp/gb/gpu-bench
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
RUNS="fp8:16: fp8:32: fp8:16:DMMA_CTAS_SET=5"; [ -z "${QUICK:-}" ] && RUNS="$RUNS bf16:16: bf16:32:"
for run in $RUNS; do
  IFS=: read kv bs def <<< "$run"
  BROOK_DECODE_DEFINES=$def BROOK_BLOCK_SIZE=$bs timeout 90 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1,4096/16 --kv-cache-dtype $kv --variants serving > $O/att_${kv}_$bs$def.json 2> $O/att_${kv}_$bs$def.log
  echo "attention $kv blocks of $bs $def rc $?"; grep -h "paged decode\|copy floor" $O/att_${kv}_$bs$def.log | sed 's/, rel. err.*//'
done 2>&1 | tee $O/att.txt
# Session 51's script leaves gpu.txt in o1/ on other cards and only in call1.tgz on an H200.
h200() { grep -q H200 $OUT/o1/gpu.txt 2>/dev/null || tar xzf $OUT/call1.tgz -O o1/gpu.txt 2>/dev/null | grep -q H200; }
if [ -z "${QUICK:-}" ] && h200; then
  for bs in 16 32; do
    BROOK_BLOCK_SIZE=$bs timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off.json 2>> $O/off.log
    echo "offline e4m3 blocks of $bs rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)"
  done 2>&1 | tee $O/off.txt
fi
echo "seconds $SECONDS" | tee -a $O/att.txt
true
