#!/usr/bin/env bash
# Session 27, call B (carry [".carry/gb27"]): session 25 call 2's traces (TTFT 2048 and a batch-512
# decode step with SM clock and power every 10 ms), session 25 call 3's residual_gemm A/B, and
# session 25 call 4's decode attention timed back to back, on this commit's gpu-bench.
xz -dc .carry/gb27/gpu-bench.xz > /tmp/gpu-bench-27 && chmod +x /tmp/gpu-bench-27 || exit 1
mkdir -p /tmp/gb && cp /tmp/gpu-bench-27 /tmp/gb/gpu-bench
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
G=/tmp/gb/gpu-bench
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
for round in 1 2; do for rg in 0 1; do
  BROOK_RESIDUAL_GEMM=$rg timeout 100 $G ttft --model llama-2-7b --input-len 2048 >>"$OUT/ab_ttft.jsonl" 2>>"$OUT/ab.log"
  BROOK_RESIDUAL_GEMM=$rg timeout 100 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 12 >>"$OUT/ab_dec.jsonl" 2>>"$OUT/ab.log"
done; done
grep -h -o '"median_ms":[0-9.]*\|"residual_gemm":[a-z]*\|"figure":"[a-z_0-9]*"' "$OUT"/ab_*.jsonl | paste - - - | head
timeout 120 $G attention --decode-only --shapes 32/32/128,32/8/128 --cases 4096/1,16384/1,4096/16 --variants default >"$OUT/attn_b2b.jsonl" 2>"$OUT/attn_b2b.log"; echo "attention b2b rc $?"
grep "paged decode" "$OUT/attn_b2b.log"
