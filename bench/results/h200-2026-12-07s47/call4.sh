#!/usr/bin/env bash
# Session 47, call 4: the tensor-core decode kernel's first-pass block-table read moved before
# the context length and the PDL wait (DMMA_BT_EARLY 1, the default in .carry/gb47b), against
# call 2's B and main's A, in one binary through BROOK_DECODE_DEFINES:
#   A  DMMA_BT_AHEAD=0   main before this session
#   B  DMMA_BT_EARLY=0   call 2's B (next pass's entries read during this pass)
#   E  (none)            B + the first pass's entries read early (split 0, no window)
# Then the paged-decode kernel tests and cuda_e2e on E. On an H200 (carry also .carry/gb44a and
# .carry/gb45) session 46's call1.sh runs first. carry [".carry/gb47b"] (+ those two).
# Everything under $OUT is packed into $OUT/call4.tgz at the end.
set -u
O=$OUT/o4; mkdir -p "$O" /tmp/gb || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
grep -q H200 $O/gpu.txt && [ -d .carry/gb45 ] && H200_ONLY=1 bash "$(dirname "$0")/../h200-2026-12-07s46/call1.sh"
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb47b/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench
def() { case $1 in A) echo DMMA_BT_AHEAD=0;; B) echo DMMA_BT_EARLY=0;; E) echo;; esac; }
for v in A B E; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 100 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1,4096/16 --kv-cache-dtype fp8,bf16 --variants default,fill6-inline-mma,fill4-inline-mma > /dev/null 2> $O/att$v.log
  echo "attention $v rc $?"; grep -h "mma" $O/att$v.log | sed "s/^.*paged decode /$v /; s/ GB\/s.*back to back/ b2b/; s/splits, rel. err. vs default/splits, err/"
done > $O/att.txt 2>&1
grep -c . $O/att.txt
step() { BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G decode-batch --model $2 --batch 512 --context $3 --steps 24 --kv-cache-dtype fp8 > $O/d.json 2>> $O/step.log
  echo "$1 | decode-batch $2 512 x $3 fp8 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' $O/d.json | tr '\n' ' ')"; }
for r in 1 2; do for v in A B E; do step $v llama-2-7b 192; done; done 2>&1 | tee $O/step.txt
for v in A E; do step $v llama-3-8b 1000; done 2>&1 | tee -a $O/step.txt
for r in 1 2; do for v in A E; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 40 $G decode --quick --model llama-3-8b --output-len 256 > $O/d.json 2>> $O/step.log
  echo "$v | decode b1 llama-3-8b bf16 rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)"
done; done 2>&1 | tee -a $O/step.txt
for v in A E A E; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off.json 2>> $O/off.log
  echo "offline $v e4m3 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)"
done 2>&1 | tee $O/off.txt
rm -f $O/d.json $O/off.json
# The tests take ~210 s: only where they end before the device's 600 s limit (the tar must run).
if [ $SECONDS -lt 340 ]; then
  timeout 240 /tmp/gb/cuda_kernels paged_decode > $O/kdec.log 2>&1; echo "cuda_kernels paged_decode rc $?"
  grep -h "test result\|FAILED\|panicked" $O/kdec.log | head -6
  timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
  grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
else echo "tests skipped at $SECONDS s"; fi
cd $OUT && tar czf call4.tgz $(ls -d o1 o4 2>/dev/null) && rm -rf o1 o4
true
