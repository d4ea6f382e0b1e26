#!/usr/bin/env bash
# Session 14 call 1: CUDA tests against the new CPU numerics + merge change, attention/decode A/B,
# ncu per-kernel profile of a 2048-token prefill, offline 512x128/128 batched-token sweep.
set -u
R=$(pwd)
tar xJf .carry/pack/c14.txz -C /tmp
cd /tmp/c14
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
O=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/log.txt
t() { local n=$1; shift; local s=$(date +%s); "$@" >> $O/log.txt 2>&1; echo "$n: rc $?, $(( $(date +%s) - s )) s" >> $O/summary.txt; }
t kernels_paged ./cuda_kernels --test-threads=1 paged_decode
t e2e ./cuda_e2e --test-threads=1
t models ./cuda_models --test-threads=1
t ws ./cuda_ws --test-threads=1
for v in before new; do
  b=./gpu-bench; [ $v = before ] && b=./gpu-bench-before
  echo "== attention $v" >> $O/bench.log
  $b attention --decode-only >> $O/bench.log 2>&1
  echo "== decode $v" >> $O/bench.log
  $b decode --quick >> $O/bench.log 2>&1
done
echo "== decode-variants new ctx 8192" >> $O/bench.log
./gpu-bench decode-variants --input-len 8192 --variants untimed >> $O/bench.log 2>&1
s=$(date +%s)
/usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  -k 'regex:^(?!fill|rand|init)' --launch-count 700 ./gpu-bench ttft --input-len 2048 > $O/ncu_ttft.csv 2> $O/ncu.err
echo "ncu: rc $?, $(( $(date +%s) - s )) s" >> $O/summary.txt
for bt in 8192 16384 4096; do
  echo "== offline fp8 mnbt $bt" >> $O/bench.log
  ./gpu-bench offline --kv-cache-dtype fp8 --max-num-batched-tokens $bt >> $O/bench.log 2>&1
done
gzip -f $O/ncu_ttft.csv
cat $O/summary.txt
