#!/usr/bin/env bash
# Run in session 49 (2026-12-07 ~16:41 UTC, on an H100) at 8834298. Outputs in call3/, BENCHMARKS.md session 49.
# Session 49, call 3: the shared-memory ring with its copies through L1 (DMMA_RING_CA), which
# matched the register passes on an H100 in call 2 (the .cg ring saturated L2 at 54 % of DRAM),
# end to end: attention, a decode step of 512 x 192 and offline 512 x 128/128 with the e4m3
# cache; on an H200 first decode batch 1, gemv scalar dots (.carry/gb44a) against tensor-core
# dots (gb49). carry [".carry/gb49", ".carry/gb44a"]. Outputs in $OUT/call3.tgz.
set -u
O=$OUT/o3; mkdir -p /tmp/gb "$O" || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
xz -dc .carry/gb49/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench
H200=0; grep -q H200 $O/gpu.txt && H200=1
if [ $H200 = 1 ] && [ -d .carry/gb44a ]; then
  xz -dc .carry/gb44a/gpu-bench.xz > /tmp/gb/gb44a && chmod +x /tmp/gb/gb44a || exit 1
  for r in 1 2; do for g in gb44a gpu-bench; do
    timeout 40 /tmp/gb/$g decode --quick --model llama-2-7b --output-len 256 > $O/d.json 2>> $O/b1.log
    echo "$g | decode b1 llama-2-7b rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)"
  done; done 2>&1 | tee $O/b1.txt
fi
def() { case $1 in B) echo;; R3c4ca) echo DMMA_RING=3,DMMA_CTAS_SET=4,DMMA_RING_CA=1;;
  R4ca) echo DMMA_RING=4,DMMA_RING_CA=1;; R2c4ca) echo DMMA_RING=2,DMMA_CTAS_SET=4,DMMA_RING_CA=1;;
  R2ca) echo DMMA_RING=2,DMMA_RING_CA=1;; esac; }
att() { # variant dtype variant
  BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1,4096/16 --kv-cache-dtype $2 --variants $3 > /dev/null 2> $O/att$1$2.log
  echo "attention $1 $2 rc $?"; grep -h "paged decode" $O/att$1$2.log | sed "s/^.*paged decode /$1 /; s/ GB\/s.*back to back/ b2b/; s/splits, rel. err. vs default/splits, err/"; }
{ for v in B R3c4ca R4ca R2c4ca B R3c4ca R4ca; do att $v fp8 fill6-inline-mma; done
  [ $H200 = 1 ] && for v in B R2ca; do att $v bf16 fill4-inline-mma; done; } 2>&1 | tee $O/att.txt
step() { BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8 > $O/d.json 2>> $O/step.log
  echo "$1 | decode-batch llama-2-7b 512 x 192 fp8 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' $O/d.json | tr '\n' ' ')"; }
for r in 1 2; do for v in B R3c4ca R4ca; do step $v; done; done 2>&1 | tee $O/step.txt
for r in 1 2; do for v in B R3c4ca; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off.json 2>> $O/off.log
  echo "offline $v e4m3 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)"
done; done 2>&1 | tee $O/off.txt
rm -f $O/d.json $O/off.json
echo "seconds $SECONDS"
tar czf $OUT/call3.tgz -C $OUT o3 && rm -rf $OUT/o3
true
