#!/usr/bin/env bash
# Session 20, call 9: the wgmma kernels' softmax scales in the exponent's FMA (the max of raw
# scores scaled once; 32 FMUL a tile less per thread): prefill kernel tests (every build),
# prefill-chunks and TTFT A/B against the previous binary (gpu-bench-old, 0dc8195's kernels),
# CUDA-vs-CPU.
R=$PWD
tar xJf .carry/s20/new.txz -C /tmp && B=/tmp/s20
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 130 ./cuda_kernels prefill --test-threads 4) > $OUT/tests.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log | head
for b in gpu-bench-old gpu-bench; do
  timeout 80 ./$b prefill-chunks --model llama-2-7b > $OUT/chunks_$b.jsonl 2> $OUT/chunks_$b.log
done
python3 -c "
import json
old={ (r['ctx'],r['chunk']): r for l in open('$OUT/chunks_gpu-bench-old.jsonl') for r in json.loads(l)['rows']}
for l in open('$OUT/chunks_gpu-bench.jsonl'):
    for r in json.loads(l)['rows']:
        o=old[(r['ctx'],r['chunk'])]; k=lambda x: x['wg_stages_split_us']
        print(r['ctx'], r['chunk'], 'tma old/new', round(o['split_us'],1), round(r['split_us'],1), {n[18:]: (round(k(o)[n],1), round(v,1)) for n,v in k(r).items()})"
for i in 1 2; do for b in gpu-bench-old gpu-bench; do
  timeout 40 ./$b ttft --model llama-2-7b --input-len 2048 | sed "s/^/$b /" >> $OUT/ttft.txt 2>> $OUT/bench.log
done; done
cut -c1-60 $OUT/ttft.txt; grep -o '"median_ms":[0-9.]*' $OUT/ttft.txt
(time timeout 60 ./cuda_e2e --test-threads=1) > $OUT/e2e.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/e2e.log | head -3
