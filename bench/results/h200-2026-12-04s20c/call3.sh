#!/usr/bin/env bash
# Session 20, call 3: what limits the wgmma prefill kernel. ncu sections (speed of light, compute
# and memory workload, scheduler, warp states, source counters) for one 2048-query launch of
# Llama-2-7B's TTFT, the 1-stage (3 CTAs an SM) and the pipelined 2-stage build.
R=$PWD
tar xJf .carry/s20/new.txz -C /tmp && B=/tmp/s20
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
cd $B
for st in 1 2; do
  BROOK_PREFILL_WG_STAGES=$st timeout 200 /usr/local/cuda/bin/ncu --clock-control none \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg \
    -k regex:prefill_attn_wg --launch-skip 40 --launch-count 1 \
    ./gpu-bench ttft --model llama-2-7b --input-len 2048 > $OUT/ncu_st$st.txt 2>&1
  grep -E "Duration|Throughput|Pipe|gmma|shared|Issue|Stall|stall|Registers|Occupancy|Eligible|No Eligible|inst_executed|cycles" $OUT/ncu_st$st.txt | head -80
done
