#!/usr/bin/env bash
# Session 19, call 3: the wgmma prefill kernel, one K/V tile at 3 CTAs an SM (rings of 2 and 3 as variants), branch-free mask, ex2.approx, lazy rescale, block-table entries a tile ahead:
# its tests, prefill-chunks (wgmma vs mma.sync), TTFT A/B, ncu of one TTFT launch.
R=$PWD
tar xJf .carry/s19/new.txz -C /tmp && B=/tmp/s19
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 150 ./cuda_kernels prefill --test-threads 2) > $OUT/tests.log 2>&1
grep "test result\|FAILED\|panicked" $OUT/tests.log | head
timeout 200 ./gpu-bench prefill-chunks --model llama-2-7b,llama-3-8b > $OUT/chunks.jsonl 2> $OUT/chunks.log
grep "chunk 2048\|chunk  512\|rror" $OUT/chunks.log | cut -c1-260
for i in 1 2; do for w in 1 0; do
  BROOK_PREFILL_WGMMA=$w timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/ttft.jsonl 2>> $OUT/ttft.log
done; done
grep -h ttft $OUT/ttft.jsonl | python3 -c "import sys,json; [print(d['prefill_wgmma'], round(d['median_ms'],2), round(d['gpu_span_ms'],2)) for d in map(json.loads, sys.stdin)]"
timeout 150 /usr/local/cuda/bin/ncu --clock-control none --set full -k regex:prefill_attn_wg --launch-skip 40 --launch-count 1 -o $OUT/ncu_wg ./gpu-bench ttft --model llama-2-7b --input-len 2048 > $OUT/ncu.log 2>&1
/usr/local/cuda/bin/ncu --import $OUT/ncu_wg.ncu-rep --page details --csv > $OUT/ncu_details.csv 2>&1
/usr/local/cuda/bin/ncu --import $OUT/ncu_wg.ncu-rep --page source --csv --print-source sass > $OUT/ncu_sass.csv 2>&1
gzip $OUT/ncu_sass.csv; rm -f $OUT/ncu_wg.ncu-rep
grep -i "Duration\|Registers\|Achieved Occupancy\|Theoretical Occupancy\|Compute (SM) Throughput\|Memory Throughput\|Block Limit\|Dynamic Shared" $OUT/ncu_details.csv | cut -c1-200 | head -30
(time timeout 100 ./cuda_e2e --test-threads=1) > $OUT/e2e.log 2>&1
grep -E "test result|FAILED|panicked" $OUT/e2e.log | head
