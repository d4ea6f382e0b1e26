#!/usr/bin/env bash
# Session 51, call 1: session 50's call1.sh (never run: no machine started; folded in here) with
# a gpu-bench that prints a copy floor beside each decode attention case (a device-to-device memcpy moving the
# case's K/V bytes: what "% of copy bandwidth" a launch of that size can reach), and times each
# launch lone, 8 back to back and queued behind a spin (alone, without the host's latency).
# First, on any card: decode attention bf16 and e4m3 (the old default and the serving rule) with
# the copy floor (elsewhere then cuda_e2e, unless SKIP_E2E). Then, on an H200 only
# (session 49 measured the rest on an H100): decode batch 1, gemv scalar dots (.carry/gb44a)
# against tensor-core dots and stream-floor of each; the e4m3 ring against the register passes
# (BROOK_DECODE_DEFINES=DMMA_RING=0): attention, a 512 x 192 step, offline 512 x 128/128 (e4m3
# cache) alternated twice; offline bf16 once; cuda_e2e on one thread.
# carry [".carry/gb51", ".carry/gb44a"] (gb51: main's code with the serving split rule shared
# with gpu-bench, DecodeSplitRule; scripts/gpu-pack.sh). About 330 s on an H200; SKIP_E2E=1
# drops the tests, QUICK=1 runs one round and no tests (~180 s). In session 51 it ran twice, both
# times on an H100 (call1-h100/: the first part at f6ff0c6, before the serving row; call2-h100/:
# cuda_e2e at 886e8b6). The H200 part has not run yet (BENCHMARKS.md, session 51).
set -u
O=$OUT/o1; mkdir -p /tmp/gb "$O" || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for b in gpu-bench cuda_e2e; do
  xz -dc .carry/gb51/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb44a/gpu-bench.xz > /tmp/gb/gb44a && chmod +x /tmp/gb/gb44a || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench
for kv in bf16 fp8; do
  timeout 90 $G attention --decode-only --shapes 32/32/128,32/8/128 --cases 1024/1,4096/1,16384/1,4096/16 \
    --kv-cache-dtype $kv --variants default,serving > $O/floor_$kv.json 2> $O/floor_$kv.log
  echo "attention + copy floor $kv rc $?"; grep -h "paged decode\|copy floor" $O/floor_$kv.log | sed 's/, rel. err.*//'
done 2>&1 | tee $O/floor.txt
# The rest was measured on an H100 in session 49: on any other card, stop here.
if ! grep -q H200 $O/gpu.txt; then
  echo "not an H200: the rest not run"
  if [ -z "${SKIP_E2E:-}" ]; then
    timeout 200 /tmp/gb/cuda_e2e --test-threads=1 > $O/e2e.log 2>&1; echo "cuda_e2e (1 thread) rc $?" | tee $O/tests.txt
    grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6 | tee -a $O/tests.txt
  fi
  tar czf $OUT/call1.tgz -C $OUT o1; exit 0
fi
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
