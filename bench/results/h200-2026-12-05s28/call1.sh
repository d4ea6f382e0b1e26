#!/usr/bin/env bash
# Session 28, call 1 (carry [".carry/gb28"], packed by pack.sh at this commit): what session 27
# left for the next GPU, and the fused bulk decode layer (`fuse_bulk`, new, off by default).
#  1. The new kernel test (gemv_bulk_builds_its_input_and_adds_into_the_residual) with the
#     other gemv tests; every cuda_e2e test with the defaults session 27 turned on (warm-up and
#     residual_gemm in every backend), the new fused-layer test and the tensor-parallel tests
#     with the Phi-3 test's fix (never rerun).
#  2. Decode batch 1, fused bulk layer off/on, alternated twice (Llama-2-7B, Llama-3-8B).
#  3. TTFT 2048 back to back against 300 ms idle before each run, alternated twice, with
#     nvidia-smi sampling SM clock, power and the clock-event (throttle) reasons every 20 ms,
#     then offline 512x128/128: on the H100 the back-to-back prefills ran at lowered clocks;
#     which limit lowers them?
mkdir -p /tmp/gb && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc .carry/gb28/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.max.mem --format=csv
timeout 90 /tmp/gb/cuda_kernels gemv --test-threads 1 >"$OUT/cuda_kernels_gemv.log" 2>&1; echo "cuda_kernels gemv rc $?"
grep -E "test result|FAILED|panicked" "$OUT/cuda_kernels_gemv.log" | head
timeout 200 /tmp/gb/cuda_e2e --test-threads 1 >"$OUT/cuda_e2e.log" 2>&1; echo "cuda_e2e rc $?"
grep -E "test result|FAILED|panicked" "$OUT/cuda_e2e.log" | head -20
grep -E "^test (tp::|cuda_matches_cpu_with_fused)" "$OUT/cuda_e2e.log"
for round in 1 2; do for model in llama-2-7b llama-3-8b; do for f in 0 1; do
  BROOK_FUSE_BULK=$f timeout 60 $G decode --quick --model $model --output-len 512 >>"$OUT/decode.jsonl" 2>>"$OUT/decode.log"; echo "decode $model fuse $f rc $?"
done; done; done
grep -v "INFO\|BackendInfo" "$OUT/decode.log" | tail -10
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
R=clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown
nvidia-smi --query-gpu=$R --format=csv >/dev/null 2>&1 || R=$(echo $R | sed 's/clocks_event_reasons/clocks_throttle_reasons/g')
nvidia-smi --query-gpu=$Q,$R --format=csv -lms 20 >"$OUT/smi.csv" 2>"$OUT/smi.err" &
SMI=$!
sleep 1
for round in 1 2; do for gap in 0 300; do
  echo "$(date +%H:%M:%S.%N) ttft gap $gap round $round start" >>"$OUT/marks.log"
  timeout 100 $G ttft --model llama-2-7b --input-len 2048 --gap-ms $gap >>"$OUT/gap_ttft.jsonl" 2>>"$OUT/gap.log"
  echo "$(date +%H:%M:%S.%N) ttft gap $gap round $round end rc $?" >>"$OUT/marks.log"
done; done
echo "$(date +%H:%M:%S.%N) offline start" >>"$OUT/marks.log"
timeout 120 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 >"$OUT/offline.jsonl" 2>"$OUT/offline.log"
echo "$(date +%H:%M:%S.%N) offline end rc $?" >>"$OUT/marks.log"
kill $SMI
grep -v "INFO\|BackendInfo" "$OUT/gap.log" | tail -8
tail -2 "$OUT/offline.log"
cat "$OUT/marks.log"
