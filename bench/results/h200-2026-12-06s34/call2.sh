#!/usr/bin/env bash
# Session 34, call 2 (binaries: pack2.sh; carry [".carry/gb34b"]). Call 1 found the gemv chain
# slower than per-matrix launches (stream floor 4.67 against 4.46 ms; decode b1 5.21 against
# 4.92 ms on an H100): its grid barrier costs ~3.6 us a matrix. Here, by barrier rule
# (CHAIN_BARRIER 0 counter, 1 counter with backoff, 2 a flag per CTA):
# 1. cuda_kernels gemv (gemv, gemv_bulk, whose stage work moved into helpers the chain shares,
#    and gemv_chain under every rule, against the CPU reference); all of cuda_e2e, built with
#    lookahead "auto" as CudaBackendOptions' default (call 1 ran cuda_ws / cuda_models so).
# 2. stream-floor: the chain over the model's matrices and a chain of one-stage ops (what a
#    barrier and an op's fixed work cost alone), for each rule.
# 3. decode b1 (gpu-bench decode --quick): chain off, and on under each rule, now launched with
#    PDL as well (cooperative + programmatic serialization, where the driver takes both:
#    kernels::chain_pdl_works warns otherwise); call 1's chain launches had no PDL.
set -u
mkdir -p /tmp/gb "$OUT/o2" && for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb34b/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
timeout 150 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
echo "stream-floor rc $?"; grep "stream floor\|rror" $O/floor.log
timeout 120 /tmp/gb/cuda_kernels gemv --test-threads 1 > $O/tests.log 2>&1; echo "cuda_kernels gemv (gemv, gemv_bulk, gemv_chain) rc $?"
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 >> $O/tests.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked\|error" $O/tests.log | head -20
for c in off 0 1 2 off 2; do
  case $c in off) env="BROOK_GEMV_CHAIN=0";; *) env="BROOK_GEMV_CHAIN=1 BROOK_CHAIN_BARRIER=$c";; esac
  env $env timeout 60 /tmp/gb/gpu-bench decode --model llama-2-7b --quick >> $O/decode.jsonl 2>> $O/decode.log
  echo "decode $env rc $?" | tee -a $O/decode.log
done
grep "median\|rc \|rror" $O/decode.log
