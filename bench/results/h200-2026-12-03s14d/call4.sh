#!/usr/bin/env bash
# Session 14 call 4: rope_kv / silu_mul / prefill K-ldmatrix: kernel tests, CUDA-vs-CPU, TTFT and
# prefill attention before (16662a7) / after, ncu per kernel of a 2048-token prefill, decode b1.
set -u
R=$(pwd)
cd /tmp/c14b
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
O=$OUT
t() { local n=$1; shift; local s=$(date +%s); "$@" >> $O/log.txt 2>&1; echo "$n: rc $?, $(( $(date +%s) - s )) s" >> $O/summary.txt; }
t kernels timeout 100 ./cuda_kernels --test-threads=4 silu_mul rope_kv prefill_attention
t e2e timeout 60 ./cuda_e2e --test-threads=1
t models timeout 30 ./cuda_models --test-threads=1 --nocapture
for v in before new; do
  b=./gpu-bench; [ $v = before ] && b=./gpu-bench-before
  echo "== ttft $v" >> $O/bench.log; timeout 40 $b ttft --input-len 2048 >> $O/bench.log 2>&1
done
for v in before new; do
  b=./gpu-bench; [ $v = before ] && b=./gpu-bench-before
  echo "== prefill-attn $v" >> $O/bench.log; timeout 40 $b prefill-attn --model llama-2-7b >> $O/bench.log 2>&1
done
s=$(date +%s)
timeout 40 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  -k 'regex:^(?!fill|rand|init)' --launch-count 300 ./gpu-bench ttft --input-len 2048 > $O/ncu_ttft.csv 2> $O/ncu.err
echo "ncu: rc $?, $(( $(date +%s) - s )) s" >> $O/summary.txt
gzip -f $O/ncu_ttft.csv
echo "== decode new" >> $O/bench.log; timeout 40 ./gpu-bench decode --quick >> $O/bench.log 2>&1
echo "== offline fp8 new" >> $O/bench.log; timeout 40 ./gpu-bench offline --kv-cache-dtype fp8 >> $O/bench.log 2>&1
cat $O/summary.txt
