#!/usr/bin/env bash
# Session 47, call 2: the tensor-core decode kernel's tuning at short contexts and big batches,
# where it reads the e4m3 cache at 64 % of copy on the H200 (session 43: 192 keys x 512).
# carry [".carry/gb47"] (scripts/gpu-pack.sh at this session's tree: DMMA_BT_AHEAD 1 default).
# Variants in one binary, through BROOK_DECODE_DEFINES (the lane kernel never reads them):
#   A  DMMA_BT_AHEAD=0            the kernel as on main (block table read at each pass)
#   B  (none)                     the next pass's block-table entries read during this pass
#   C  DMMA_CTAS_SET=4            B at 4 CTAs an SM (128 registers, small spill)
#   D  DMMA_U_SET=3,DMMA_CTAS_SET=2  B with 3 steps a pass at 2 CTAs an SM
# On an H200 with carry [".carry/gb44a", ".carry/gb45", ".carry/gb47"] it runs call1.sh first.
# Then the paged-decode kernel tests and cuda_e2e on B. Outputs under $OUT/o2.
set -u
O=$OUT/o2; mkdir -p /tmp/gb "$O" || exit 1
for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb47/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
# On an H200, first the measurement still missing there (call1.sh; also carry .carry/gb44a and
# .carry/gb45), outputs under $OUT/o1.
grep -q H200 $O/gpu.txt && [ -d .carry/gb45 ] && bash "$(dirname "$0")/call1.sh"
def() { case $1 in A) echo DMMA_BT_AHEAD=0;; B) echo;; C) echo DMMA_CTAS_SET=4;; D) echo DMMA_U_SET=3,DMMA_CTAS_SET=2;; esac; }
att() { BROOK_DECODE_DEFINES=$(def $1) timeout 120 /tmp/gb/gpu-bench attention --decode-only \
  --shapes 32/32/128,32/8/128 --cases 192/512,1000/512,4096/1,4096/16 --kv-cache-dtype fp8,bf16 \
  --variants default,fill6-inline-mma,fill4-inline-mma,fill4-k128-cluster-mma > $O/att$1.json 2> $O/att$1.log
  echo "attention $1 rc $?"; grep -h "mma" $O/att$1.log | sed "s/^.*paged decode /$1 /; s/ GB\/s.*back to back/ b2b/; s/splits, rel. err. vs default/splits, err/"; }
for v in A B C D; do att $v; done 2>&1 | tee $O/att.txt
step() { BROOK_DECODE_DEFINES=$(def $1) timeout 60 /tmp/gb/gpu-bench decode-batch --model $2 --batch 512 --context $3 --steps 24 --kv-cache-dtype $4 > $O/d.json 2>> $O/step.log
  echo "$1 | decode-batch $2 512 x $3 $4 rc $?: $(grep -o '"median_ms":[0-9.]*\|"gpu_span_ms":[0-9.]*' $O/d.json | tr '\n' ' ')"; }
for r in 1 2; do for v in A B C D; do step $v llama-2-7b 192 fp8; done; done 2>&1 | tee $O/step.txt
for v in A B; do step $v llama-3-8b 1000 fp8; step $v llama-3-8b 1000 bf16; done 2>&1 | tee -a $O/step.txt
off() { BROOK_DECODE_DEFINES=$(def $1) timeout 90 /tmp/gb/gpu-bench offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8 > $O/off$1.json 2>> $O/off.log
  echo "offline $1 e4m3 rc $?: $(grep -o '"output_tok_s":[0-9.]*' $O/off$1.json | tr '\n' ' ')"; }
for v in A B A B; do off $v; done 2>&1 | tee $O/off.txt
timeout 240 /tmp/gb/cuda_kernels paged_decode > $O/kdec.log 2>&1; echo "cuda_kernels paged_decode rc $?"
grep -h "test result\|FAILED\|panicked" $O/kdec.log | head -6
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -6
true
