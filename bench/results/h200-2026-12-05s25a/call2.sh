#!/usr/bin/env bash
# Session 25, call 2 (not yet run; pack with pack.sh, carry [".carry/gb25"]; ~5 min):
#  1. GPU tests of this commit: cuda_kernels (new: trace, gemm_adds_into_f32_output) and
#     cuda_e2e (new: cuda_matches_cpu_with_residual_gemm,
#     cuda_warm_up_runs_and_leaves_the_backend_as_it_was).
#  2. In-situ per-launch trace (`--trace`) of the TTFT 2048 step and a batch-512 decode step
#     (Llama-2-7B bf16) with SM clock and power sampled every 10 ms: call 1's ncu kernel sum
#     (43.5 ms) fell 5.8 ms short of the step's GPU span (49.3 ms).
mkdir -p /tmp/gb && for b in gpu-bench cuda_kernels cuda_e2e; do
  xz -dc .carry/gb25/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
G=/tmp/gb/gpu-bench
(cd .carry && BROOK_REQUIRE_GPU=1 timeout 150 /tmp/gb/cuda_kernels --test-threads 1 >"$OUT/cuda_kernels.log" 2>&1; echo "cuda_kernels rc $?")
grep -E "test result|FAILED|panicked" "$OUT/cuda_kernels.log" | head
(cd .carry && BROOK_REQUIRE_GPU=1 timeout 200 /tmp/gb/cuda_e2e --test-threads 1 >"$OUT/cuda_e2e.log" 2>&1; echo "cuda_e2e rc $?")
grep -E "test result|FAILED|panicked" "$OUT/cuda_e2e.log" | head
SMI="nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 10"
$SMI > "$OUT/smi_ttft.csv" & S=$!
timeout 100 $G ttft --model llama-2-7b --input-len 2048 --trace >"$OUT/ttft_trace.jsonl" 2>"$OUT/ttft_trace.log"; echo "ttft trace rc $?"
kill $S
grep -v "INFO\|BackendInfo" "$OUT/ttft_trace.log" | head -30
$SMI > "$OUT/smi_dec.csv" & S=$!
timeout 100 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 8 --trace >"$OUT/dec_trace.jsonl" 2>"$OUT/dec_trace.log"; echo "dec trace rc $?"
kill $S
grep -v "INFO\|BackendInfo" "$OUT/dec_trace.log" | head -30
# SM clocks of the busy samples (power over 150 W), and their power.
for f in smi_ttft smi_dec; do echo "$f:"; awk -F', ' 'NR>1 && $4+0>150 {print $2}' "$OUT/$f.csv" | sort | uniq -c | sort -k2 -n | tail -12
  awk -F', ' 'NR>1 && $4+0>150 {n++; s+=$4; if ($4+0>m) m=$4+0} END {print n" busy samples, mean "s/n" W, max "m" W"}' "$OUT/$f.csv"; done
