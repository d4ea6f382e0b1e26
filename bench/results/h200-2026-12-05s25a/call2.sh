#!/usr/bin/env bash
# Session 25, call 2: in-situ per-launch trace (events between launches, `--trace`) of the TTFT
# 2048 step and a batch-512 decode step (Llama-2-7B bf16), with SM clock and power sampled
# every 10 ms: call 1's ncu kernel sum (43.5 ms) fell 5.8 ms short of the step's GPU span.
# Carry: .carry/gb25 (gpu-bench of this commit, xz)
mkdir -p /tmp/gb && xz -dc .carry/gb25/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
G=/tmp/gb/gpu-bench
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 10 > "$OUT/smi_ttft.csv" & SMI=$!
timeout 120 $G ttft --model llama-2-7b --input-len 2048 --trace >"$OUT/ttft.jsonl" 2>"$OUT/ttft.log"; echo "ttft rc $?"
kill $SMI
grep -v "INFO\|BackendInfo" "$OUT/ttft.log" | head -40
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 10 > "$OUT/smi_dec.csv" & SMI=$!
timeout 120 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 8 --trace >"$OUT/dec.jsonl" 2>"$OUT/dec.log"; echo "dec rc $?"
kill $SMI
grep -v "INFO\|BackendInfo" "$OUT/dec.log" | head -30
# SM clocks of the busy samples (power over 150 W), and their power.
for f in smi_ttft smi_dec; do echo "$f:"; awk -F', ' 'NR>1 && $4+0>150 {print $2}' "$OUT/$f.csv" | sort | uniq -c | sort -k2 -n | tail -12
  awk -F', ' 'NR>1 && $4+0>150 {n++; s+=$4; if ($4+0>m) m=$4+0} END {print n" busy samples, mean "s/n" W, max "m" W"}' "$OUT/$f.csv"; done
# The trace's own test, with the kernel tests it sits among.
xz -dc .carry/gb25/cuda_kernels.xz > /tmp/gb/cuda_kernels && chmod +x /tmp/gb/cuda_kernels
(cd .carry && BROOK_REQUIRE_GPU=1 timeout 200 /tmp/gb/cuda_kernels --test-threads 1 >"$OUT/cuda_kernels.log" 2>&1; echo "cuda_kernels rc $?"); grep -E "test result|FAILED|panicked" "$OUT/cuda_kernels.log" | head
# Per-kernel durations (ncu, clocks and caches left alone) of decode batch 1 (Llama-2-7B bf16,
# graph nodes one by one): which GEMVs fall short of copy bandwidth, and what the rest costs.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NC="$NCU --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base"
timeout 240 $NC $G decode --quick --model llama-2-7b --output-len 6 >"$OUT/ncu_decode_b1.csv" 2>"$OUT/ncu_decode_b1.log"; echo "ncu decode b1 rc $?"; grep -v "INFO\|BackendInfo" "$OUT/ncu_decode_b1.log" | tail -3
# The wgmma prefill attention at 2k under ncu's speed-of-light and memory sections: is L2 the
# limit (each 64-row CTA loads its own K/V tiles; a 128-row CTA of two warpgroups halves that)?
timeout 200 $NCU --clock-control none --kernel-name regex:prefill_attn_wg --launch-skip 40 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats $G ttft --model llama-2-7b --input-len 2048 >"$OUT/ncu_prefill_attn.txt" 2>&1; echo "ncu prefill attn rc $?"
grep -E "Duration|Throughput|L2 Cache|L1/TEX|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|Mem Busy|Max Bandwidth" "$OUT/ncu_prefill_attn.txt" | head -40
