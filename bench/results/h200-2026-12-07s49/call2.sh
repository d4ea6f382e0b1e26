#!/usr/bin/env bash
# Run in session 49 (2026-12-07 ~16:37 UTC, on an H100) with the overrides as built at 8834298 (DMMA_RING_CA and DMMA_RING_COAL, since replaced: the ring now always copies through L1). Outputs in call2/, BENCHMARKS.md session 49.
# Session 49, call 2: why the tensor-core decode kernel's shared-memory ring (DMMA_RING) read at
# ~1.8 TB/s on an H100 in call 1 whatever its depth or cache dtype, and two ways of issuing its
# copies: DMMA_RING_CA (cp.async.ca: a lane's slice spans several 16-byte chunks of a sector;
# only L1 merges the halves) and DMMA_RING_COAL (lanes copy whole rows for one another). Any
# card; on an H200 it first times decode batch 1, gemv scalar dots (.carry/gb44a) against
# tensor-core dots (gb49), still unmeasured there. carry [".carry/gb49", ".carry/gb44a"].
# Outputs in $OUT/call2.tgz.
set -u
O=$OUT/o2; mkdir -p /tmp/gb "$O" || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for b in gpu-bench cuda_kernels; do
  xz -dc .carry/gb49/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1 PATH=$PATH:/usr/local/cuda/bin
G=/tmp/gb/gpu-bench
if grep -q H200 $O/gpu.txt && [ -d .carry/gb44a ]; then
  xz -dc .carry/gb44a/gpu-bench.xz > /tmp/gb/gb44a && chmod +x /tmp/gb/gb44a || exit 1
  for r in 1 2; do for g in gb44a gpu-bench; do
    timeout 40 /tmp/gb/$g decode --quick --model llama-2-7b --output-len 256 > $O/d.json 2>> $O/b1.log
    echo "$g | decode b1 llama-2-7b rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)"
  done; done 2>&1 | tee $O/b1.txt
fi
def() { case $1 in B) echo;; R3c4) echo DMMA_RING=3,DMMA_CTAS_SET=4;;
  R3c4ca) echo DMMA_RING=3,DMMA_CTAS_SET=4,DMMA_RING_CA=1;;
  R3c4co) echo DMMA_RING=3,DMMA_CTAS_SET=4,DMMA_RING_COAL=1;;
  R2c4co) echo DMMA_RING=2,DMMA_CTAS_SET=4,DMMA_RING_COAL=1;;
  R4co) echo DMMA_RING=4,DMMA_RING_COAL=1;;
  R2co) echo DMMA_RING=2,DMMA_RING_COAL=1;; R2ca) echo DMMA_RING=2,DMMA_RING_CA=1;; esac; }
att() { # variant dtype variant
  BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1,4096/16 --kv-cache-dtype $2 --variants $3 > /dev/null 2> $O/att$1$2.log
  echo "attention $1 $2 rc $?"; grep -h "paged decode" $O/att$1$2.log | sed "s/^.*paged decode /$1 /; s/ GB\/s.*back to back/ b2b/; s/splits, rel. err. vs default/splits, err/"; }
{ for v in B R3c4co R3c4ca R3c4 R2c4co R4co B R3c4co; do att $v fp8 fill6-inline-mma; done
  for v in B R2co R2ca; do att $v bf16 fill4-inline-mma; done; } 2>&1 | tee $O/att.txt
# Where the time goes at 192 keys x 512 (e4m3, MHA), one launch each under Nsight Compute.
for v in B R3c4 R3c4co R3c4ca; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 90 ncu --clock-control none -k regex:paged_decode_mma -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section Occupancy \
    --section WarpStateStats --section LaunchStats --section SchedulerStats \
    $G attention --decode-only --shapes 32/32/128 --cases 192/512 --kv-cache-dtype fp8 \
    --variants fill6-inline-mma > $O/ncu$v.txt 2>&1
  echo "ncu $v rc $?"
done
step() { BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8 > $O/d.json 2>> $O/step.log
  echo "$1 | decode-batch llama-2-7b 512 x 192 fp8 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' $O/d.json | tr '\n' ' ')"; }
for r in 1 2; do for v in B R3c4co R4co; do step $v; done; done 2>&1 | tee $O/step.txt
timeout 200 /tmp/gb/cuda_kernels paged_decode_ring > $O/kring.log 2>&1; echo "cuda_kernels paged_decode_ring rc $?"
grep -h "test result\|FAILED\|panicked" $O/kring.log | head -6
if [ $SECONDS -lt 330 ]; then
  for v in B R3c4co; do
    BROOK_DECODE_DEFINES=$(def $v) timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off.json 2>> $O/off.log
    echo "offline $v e4m3 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)"
  done 2>&1 | tee $O/off.txt
fi
rm -f $O/d.json $O/off.json
echo "seconds $SECONDS"
tar czf $OUT/call2.tgz -C $OUT o2 && rm -rf $OUT/o2
true
