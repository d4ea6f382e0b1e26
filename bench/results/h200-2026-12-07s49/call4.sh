#!/usr/bin/env bash
# Run in session 49 (2026-12-07 ~16:49 UTC, on an H100). Outputs in call4/ (call5_*: the one test the 200 s limit cut, rerun alone at ~16:54), BENCHMARKS.md session 49.
# Session 49, call 4: the e4m3 default is now the tensor-core decode kernel's 2-slot ring at 4
# CTAs an SM with its copies through L1 (best in call 3 on an H100); against the register passes
# (BROOK_DECODE_DEFINES=DMMA_RING=0) in one binary: attention, a decode step of 512 x 192,
# offline 512 x 128/128 (e4m3 cache), alternated twice; then the GPU tests of this build
# (cuda_kernels paged_decode, cuda_e2e on one test thread). On an H200 first decode batch 1, gemv
# scalar dots (.carry/gb44a) against tensor-core dots. carry [".carry/gb49b", ".carry/gb44a"].
set -u
O=$OUT/o4; mkdir -p /tmp/gb "$O" || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb49b/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
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
def() { case $1 in B) echo DMMA_RING=0;; ring) echo;; esac; }
att() {
  BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1,4096/16 --kv-cache-dtype fp8 --variants default,fill6-inline-mma > /dev/null 2> $O/att$1.log
  echo "attention $1 rc $?"; grep -h "paged decode" $O/att$1.log | sed "s/^.*paged decode /$1 /; s/ GB\/s.*back to back/ b2b/; s/splits, rel. err. vs default/splits, err/"; }
for r in 1 2; do for v in B ring; do att $v; done; done 2>&1 | tee $O/att.txt
step() { BROOK_DECODE_DEFINES=$(def $1) timeout 60 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8 > $O/d.json 2>> $O/step.log
  echo "$1 | decode-batch llama-2-7b 512 x 192 fp8 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' $O/d.json | tr '\n' ' ')"; }
for r in 1 2; do for v in B ring; do step $v; done; done 2>&1 | tee $O/step.txt
for r in 1 2; do for v in B ring; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off.json 2>> $O/off.log
  echo "offline $v e4m3 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off.json)"
done; done 2>&1 | tee $O/off.txt
timeout 200 /tmp/gb/cuda_kernels paged_decode > $O/kdec.log 2>&1; echo "cuda_kernels paged_decode rc $?"
grep -h "test result\|FAILED\|panicked" $O/kdec.log | head -6
timeout 150 /tmp/gb/cuda_e2e --test-threads=1 > $O/e2e.log 2>&1; echo "cuda_e2e (1 thread) rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
rm -f $O/d.json $O/off.json
echo "seconds $SECONDS"
tar czf $OUT/call4.tgz -C $OUT o4 && rm -rf $OUT/o4
true
