#!/usr/bin/env bash
# Asked for five more times in session 48, refused each time. RAN in session 47 at 10:34, 10:41 and 11:00 UTC: each time an H100 80GB HBM3, so it stopped at nvidia-smi; refused or held off at 10:17, 11:20, 11:31, 11:35 and 11:43.
# Session 47, call 3 and later: the H200 measurements still missing. On any card but an H200 it
# stops after nvidia-smi. On an H200: session 46's call1.sh (the bulk gemv's tensor-core dots
# against the scalar dots, outputs under $OUT/o1), then call 2's decode-attention A/B/C
# (A: DMMA_BT_AHEAD=0, B: the default, C: DMMA_CTAS_SET=4) at the shapes it moved, outputs
# under $OUT/o3; both packed into $OUT/call3.tgz at the end. carry [".carry/gb44a", ".carry/gb45", ".carry/gb47"].
set -u
O=$OUT/o3; mkdir -p "$O" /tmp/gb
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
grep -q H200 $O/gpu.txt || { echo "not an H200: stop"; exit 0; }
H200_ONLY=1 bash "$(dirname "$0")/../h200-2026-12-07s46/call1.sh"
xz -dc .carry/gb47/gpu-bench.xz > /tmp/gb/gpu-bench47 && chmod +x /tmp/gb/gpu-bench47 || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench47
def() { case $1 in A) echo DMMA_BT_AHEAD=0;; B) echo;; C) echo DMMA_CTAS_SET=4;; esac; }
for v in A B C; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 100 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1 --kv-cache-dtype fp8 --variants default,fill6-inline-mma > /dev/null 2> $O/att$v.log
  echo "attention $v rc $?"; grep -h "mma" $O/att$v.log | sed "s/^.*paged decode /$v /; s/ GB\/s.*back to back/ b2b/; s/splits, rel. err. vs default/splits, err/"
done 2>&1 | tee $O/att.txt
step() { BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8 > $O/d.json 2>> $O/step.log
  echo "$1 | decode-batch llama-2-7b 512 x 192 fp8 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' $O/d.json | tr '\n' ' ')"; }
for r in 1 2; do for v in A B C; do step $v; done; done 2>&1 | tee $O/step.txt
# SHORT=1 (call5.sh, for a shorter device budget): one offline run each, none past 300 s.
runs="A B A B"; [ "${SHORT:-0}" = 1 ] && { runs="A B"; [ $SECONDS -ge 300 ] && runs=; }
for v in $runs; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off.json 2>> $O/off.log
  echo "offline $v e4m3 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)"
done 2>&1 | tee $O/off.txt
rm -f $O/d.json $O/off.json
# One file back: the device returns only a few files from $OUT.
tar czf $OUT/call3.tgz -C $OUT o1 o3 && rm -rf $OUT/o1 $OUT/o3
true
