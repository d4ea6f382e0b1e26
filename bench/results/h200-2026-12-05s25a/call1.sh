#!/usr/bin/env bash
# Session 25, call 1 (HEAD 1ddb853): (1) gpu-bench elementwise (session 24's call 4, never run);
# (2) per-kernel durations from ncu (one metric, clocks and caches left alone) of a TTFT 2048
# step and of a batch-512 decode step, Llama-2-7B bf16: where the non-GEMM time goes, without
# the leave-one-out rows' unwritten-input effect.
# Carry: .carry/gb25 (gpu-bench of this commit, xz)
mkdir -p /tmp/gb && xz -dc .carry/gb25/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
G=/tmp/gb/gpu-bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > "$OUT/smi.txt"
timeout 200 $G elementwise --model llama-2-7b --tokens 512,2048 --reps 5 >"$OUT/elementwise.jsonl" 2>"$OUT/elementwise.log"
echo "elementwise rc $?"; grep -v INFO "$OUT/elementwise.log" | tail -20
timeout 100 $G ttft --model llama-2-7b --input-len 2048 >"$OUT/ttft.jsonl" 2>"$OUT/ttft.log"; echo "ttft rc $?"; tail -3 "$OUT/ttft.log"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
NC="$NCU --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base"
timeout 200 $NC $G ttft --model llama-2-7b --input-len 2048 >"$OUT/ncu_ttft.csv" 2>"$OUT/ncu_ttft.log"; echo "ncu ttft rc $?"; tail -3 "$OUT/ncu_ttft.log"
timeout 200 $NC $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 3 >"$OUT/ncu_dec.csv" 2>"$OUT/ncu_dec.log"; echo "ncu dec rc $?"; tail -3 "$OUT/ncu_dec.log"
wc -l "$OUT"/*.csv
