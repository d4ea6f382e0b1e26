#!/usr/bin/env bash
# Session 50, call 1: session 49's e4m3 decode default (2-slot ring, 4 CTAs an SM, copies through
# L1) against the register passes (BROOK_DECODE_DEFINES=DMMA_RING=0) in one binary, on an H200
# only (it stops at once on any other card: session 49 had only H100s). Decode batch 1 first: gemv scalar dots
# (.carry/gb44a) against tensor-core dots (main) and stream-floor of each; then attention, a decode step of 512 x 192,
# offline 512 x 128/128 (e4m3 cache) alternated twice; offline bf16 once; cuda_e2e on one thread.
# carry [".carry/gb49b", ".carry/gb44a"] (gb49b = main's code at 10cf4f3; repack with
# scripts/gpu-pack.sh if the code changes). About 300 s; SKIP_E2E=1 drops the tests, QUICK=1 runs one
# round and no tests (~150 s). Not run in session 50: no machine could be started (BENCHMARKS.md).
set -u
O=$OUT/o1; mkdir -p /tmp/gb "$O" || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
# Everything here was measured on an H100 in session 49: on any other card, stop at once.
grep -q H200 $O/gpu.txt || { echo "not an H200: nothing run"; tar czf $OUT/call1.tgz -C $OUT o1; exit 0; }
for b in gpu-bench cuda_e2e; do
  xz -dc .carry/gb49b/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb44a/gpu-bench.xz > /tmp/gb/gb44a && chmod +x /tmp/gb/gb44a || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench
ROUNDS="1 2"; [ -n "${QUICK:-}" ] && ROUNDS=1 && SKIP_E2E=1  # QUICK=1: one round, no tests
for r in $ROUNDS; do for g in gb44a gpu-bench; do
  timeout 40 /tmp/gb/$g decode --quick --model llama-2-7b --output-len 256 > $O/d.json 2>> $O/b1.log
  echo "$g | decode b1 llama-2-7b rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)"
done; done 2>&1 | tee $O/b1.txt
for g in gb44a gpu-bench; do
  timeout 90 /tmp/gb/$g stream-floor --model llama-2-7b > $O/sf_$g.json 2> $O/sf_$g.log; echo "$g stream-floor rc $?"; grep -h "ms" $O/sf_$g.log | tail -14
done 2>&1 | tee $O/sf.txt
def() { case $1 in B) echo DMMA_RING=0;; ring) echo;; esac; }
att() {
  BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1,4096/16 --kv-cache-dtype fp8 --variants default,fill6-inline-mma > /dev/null 2> $O/att$1.log
  echo "attention $1 rc $?"; grep -h "paged decode" $O/att$1.log | sed "s/^.*paged decode /$1 /; s/ GB\/s.*back to back/ b2b/; s/splits, rel. err. vs default/splits, err/"; }
for r in $ROUNDS; do for v in B ring; do att $v; done; done 2>&1 | tee $O/att.txt
step() { BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8 > $O/d.json 2>> $O/step.log
  echo "$1 | decode-batch llama-2-7b 512 x 192 fp8 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' $O/d.json | tr '\n' ' ')"; }
for r in $ROUNDS; do for v in B ring; do step $v; done; done 2>&1 | tee $O/step.txt
for r in $ROUNDS; do for v in B ring; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off.json 2>> $O/off.log
  echo "offline $v e4m3 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)"
done; done 2>&1 | tee $O/off.txt
timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 > $O/off.json 2>> $O/off.log
echo "offline bf16 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)" | tee -a $O/off.txt
if [ -z "${SKIP_E2E:-}" ]; then  # SKIP_E2E=1 when little device time is left (passed on an H100)
  timeout 150 /tmp/gb/cuda_e2e --test-threads=1 > $O/e2e.log 2>&1; echo "cuda_e2e (1 thread) rc $?" | tee $O/tests.txt
  grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6 | tee -a $O/tests.txt
fi
rm -f $O/d.json $O/off.json
echo "seconds $SECONDS" | tee -a $O/tests.txt
tar czf $OUT/call1.tgz -C $OUT o1 && rm -rf $OUT/o1
true
