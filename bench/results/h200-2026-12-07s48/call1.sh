#!/usr/bin/env bash
# Run in session 49 (2026-12-07 16:12 UTC, on an H100): results in bench/results/h200-2026-12-07s49/call1/ and BENCHMARKS.md, session 49. Session 48 could not start it.
# Re-running it at a later main measures the ring with its copies through L1 (session 49), not the .cg ring it was written for.
# Session 48, call 1: the tensor-core decode kernel with its warp steps through a ring in shared
# memory (DMMA_RING, cp.async), against its register passes, where those read the e4m3 cache at
# 64 % of copy on the H200 (session 43: 192 keys x 512). Any card; on an H200 it first times
# decode batch 1 with the gemv's scalar dots (.carry/gb44a, 580b9d3) against its tensor-core
# dots (gb48: main's gemv), two rounds alternated (session 47's call6.sh, which needs two more
# packs than the 64 MiB carry holds). carry [".carry/gb48", ".carry/gb44a"] (gb48:
# scripts/gpu-pack.sh at this session's tree). Variants in one binary (BROOK_DECODE_DEFINES):
#   B    (none)                      the register passes (main)
#   R2c4 DMMA_RING=2,DMMA_CTAS_SET=4 a ring of 2 steps a warp, 4 CTAs an SM
#   R3c4 DMMA_RING=3,DMMA_CTAS_SET=4 3 steps, 4 CTAs (48 KB + static an SM's CTA with e4m3)
#   R4   DMMA_RING=4                 4 steps, 3 CTAs (64 KB)
# With a bf16 cache only B and R2 (DMMA_RING=2: 64 KB, 3 CTAs). Outputs in $OUT/call1.tgz.
set -u
O=$OUT/o1; mkdir -p /tmp/gb "$O" || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for b in gpu-bench cuda_kernels; do
  xz -dc .carry/gb48/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench
if grep -q H200 $O/gpu.txt && [ -d .carry/gb44a ]; then
  xz -dc .carry/gb44a/gpu-bench.xz > /tmp/gb/gb44a && chmod +x /tmp/gb/gb44a || exit 1
  for r in 1 2; do for g in gb44a gpu-bench; do
    timeout 40 /tmp/gb/$g decode --quick --model llama-2-7b --output-len 256 > $O/d.json 2>> $O/b1.log
    echo "$g | decode b1 llama-2-7b rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)"
  done; done 2>&1 | tee $O/b1.txt
fi
def() { case $1 in B) echo;; R2c4) echo DMMA_RING=2,DMMA_CTAS_SET=4;; R3c4) echo DMMA_RING=3,DMMA_CTAS_SET=4;;
  R4) echo DMMA_RING=4;; R2) echo DMMA_RING=2;; esac; }
att() { # variant dtype variants
  BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1,4096/16 --kv-cache-dtype $2 --variants $3 > /dev/null 2> $O/att$1$2.log
  echo "attention $1 $2 rc $?"; grep -h "paged decode" $O/att$1$2.log | sed "s/^.*paged decode /$1 /; s/ GB\/s.*back to back/ b2b/; s/splits, rel. err. vs default/splits, err/"; }
{ for v in B R3c4 R4 R2c4 B R3c4; do att $v fp8 default,fill6-inline-mma; done
  [ $SECONDS -lt 200 ] && for v in B R2; do att $v bf16 default,fill4-inline-mma; done; } 2>&1 | tee $O/att.txt
step() { BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8 > $O/d.json 2>> $O/step.log
  echo "$1 | decode-batch llama-2-7b 512 x 192 fp8 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' $O/d.json | tr '\n' ' ')"; }
for r in 1 2; do for v in B R3c4 R4; do step $v; done; done 2>&1 | tee $O/step.txt
timeout 180 /tmp/gb/cuda_kernels paged_decode_ring > $O/kring.log 2>&1; echo "cuda_kernels paged_decode_ring rc $?"
grep -h "test result\|FAILED\|panicked" $O/kring.log | head -6
if [ $SECONDS -lt 300 ]; then
  for v in B R3c4; do
    BROOK_DECODE_DEFINES=$(def $v) timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off.json 2>> $O/off.log
    echo "offline $v e4m3 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)"
  done 2>&1 | tee $O/off.txt
fi
rm -f $O/d.json $O/off.json
echo "seconds $SECONDS"
tar czf $OUT/call1.tgz -C $OUT o1 && rm -rf $OUT/o1
true
