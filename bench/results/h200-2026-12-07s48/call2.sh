#!/usr/bin/env bash
# NOT RUN in session 48: every start refused or held off (BENCHMARKS.md, session 48).
# Superseded (session 49): call1.sh ran instead; the ring now always copies through L1 (cp.async.ca), so these DMMA_RING variants no longer measure the .cg ring described here.
# Session 48, call 2: call1.sh cut to what ~250 s of device time holds (after the starts refused
# this session had taken the rest). Any card. carry [".carry/gb48"] (+ ".carry/gb44a": on an
# H200, decode batch 1 with scalar against tensor-core gemv dots, one round). Variants as
# call1.sh: B (register passes) against R3c4 and R4 (the ring); e4m3 cache only; the serving
# rule (`default`); the ring's kernel test; a batch-512 step. Everything to stdout.
set -u
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee /tmp/gpu.txt
mkdir -p /tmp/gb
for b in gpu-bench cuda_kernels; do xz -dc .carry/gb48/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench
def() { case $1 in B) echo;; R3c4) echo DMMA_RING=3,DMMA_CTAS_SET=4;; R4) echo DMMA_RING=4;; esac; }
for v in B R3c4 R4 B; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 40 $G attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 192/512,1000/512,4096/1 --kv-cache-dtype fp8 --variants default > /dev/null 2> /tmp/a.log
  echo "attention $v rc $?"; grep -h "paged decode" /tmp/a.log | sed "s/^.*paged decode /$v /; s/ GB\/s.*back to back/ b2b/"
done
timeout 75 /tmp/gb/cuda_kernels paged_decode_ring > /tmp/k.log 2>&1; echo "cuda_kernels paged_decode_ring rc $?"
grep -h "test result\|FAILED\|panicked" /tmp/k.log | head -6; grep -h "panicked" -A3 /tmp/k.log | head -12
for v in B R3c4; do
  BROOK_DECODE_DEFINES=$(def $v) timeout 40 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8 > /tmp/d.json 2>> /tmp/step.log
  echo "$v | decode-batch llama-2-7b 512 x 192 fp8 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' /tmp/d.json | tr '\n' ' ')"
done
if grep -q H200 /tmp/gpu.txt && [ -d .carry/gb44a ] && [ $SECONDS -lt 200 ]; then
  xz -dc .carry/gb44a/gpu-bench.xz > /tmp/gb/gb44a && chmod +x /tmp/gb/gb44a
  for g in /tmp/gb/gb44a $G; do
    timeout 40 $g decode --quick --model llama-2-7b --output-len 256 > /tmp/d.json 2>> /tmp/b1.log
    echo "$g | decode b1 llama-2-7b rc $?: $(grep -o '"median_ms":[0-9.]*' /tmp/d.json | head -1)"
  done
fi
echo "seconds $SECONDS"
