#!/usr/bin/env bash
# Session 27, call C: session 25 call 4's ncu runs, then call 3's gap and cold/warm-up runs, on
# this commit (carry [".carry/gb27"]):
#  1. Per-kernel durations (ncu, clocks and caches left alone, graph nodes one by one) of
#     decode batch 1, Llama-2-7B bf16: which GEMVs fall short of copy bandwidth, what the rest
#     costs (session 21's gemv-sweep had the GEMVs alone at 3.55 of the 3.72 ms).
#  2. The wgmma prefill attention at 2k under ncu's speed-of-light, memory, occupancy and launch
#     sections: is L2 the limit (each 64-row CTA loads its own K/V tiles; a 128-row CTA of two
#     warpgroups would halve that)? With the scheduler and warp-state sections: what its warps
#     stall on (session 20's ncu of the cp.async build: 34 % of issue slots busy).
#  3. TTFT 2048 back to back against 300 ms idle before each run; `gpu-bench cold` without and
#     with the warm-up. (Item 1's run stopped: `decode --output-len 6` is too short for the
#     8 untimed steps; call D reran it with 16. Decode attention back to back moved to call B.)
mkdir -p /tmp/gb && xz -dc .carry/gb27/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
G=/tmp/gb/gpu-bench
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NC="$NCU --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base"
timeout 240 $NC $G decode --quick --model llama-2-7b --output-len 6 >"$OUT/ncu_decode_b1.csv" 2>"$OUT/ncu_decode_b1.log"; echo "ncu decode b1 rc $?"
grep -v "INFO\|BackendInfo" "$OUT/ncu_decode_b1.log" | tail -3
timeout 200 $NCU --clock-control none --kernel-name regex:prefill_attn_wg --launch-skip 40 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats $G ttft --model llama-2-7b --input-len 2048 >"$OUT/ncu_prefill_attn.txt" 2>&1; echo "ncu prefill attn rc $?"
grep -E "Duration|Throughput|L2 Cache|L1/TEX|Registers|Occupancy|Block Limit|Mem Busy|Max Bandwidth|Issue Slots|Eligible|No Eligible|Stall|Warp Cycles|Executed Ipc" "$OUT/ncu_prefill_attn.txt" | head -60
for round in 1 2; do for gap in 0 300; do
  timeout 100 $G ttft --model llama-2-7b --input-len 2048 --gap-ms $gap >>"$OUT/gap_ttft.jsonl" 2>>"$OUT/gap.log"
done; done
grep -v "INFO\|BackendInfo" "$OUT/gap.log"
for w in "" --warm-up; do
  timeout 120 $G cold --model llama-2-7b $w >>"$OUT/cold.jsonl" 2>>"$OUT/cold.log"; echo "cold $w rc $?"
done
grep -v "INFO\|BackendInfo" "$OUT/cold.log"
