#!/usr/bin/env bash
# Session 20, call 7: the TMA build with the pipelined loop (WG_TMA + WG_STAGES 2: tile t's S
# and tile t-1's O += PV in flight together, 2 CTAs an SM, 187 registers): prefill kernel tests
# (every build), prefill-chunks (its times beside the 1-stage TMA build at the rule's splits),
# TTFT A/B (BROOK_PREFILL_WG_STAGES=2 with TMA on: the pipelined TMA build).
R=$PWD
tar xJf .carry/s20/new.txz -C /tmp && B=/tmp/s20
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
cd $B
(time timeout 240 ./cuda_kernels prefill --test-threads 2) > $OUT/tests.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log | head
timeout 150 ./gpu-bench prefill-chunks --model llama-2-7b > $OUT/chunks.jsonl 2> $OUT/chunks.log
tail -2 $OUT/chunks.log | cut -c1-300
python3 -c "
import json
for l in open('$OUT/chunks.jsonl'):
    d=json.loads(l)
    for r in d['rows']:
        print(d['model'], r['ctx'], r['chunk'], 'rule', r['splits'], {k[18:]: round(v,1) for k,v in r['wg_stages_split_us'].items()})"
for i in 1 2; do for st in 1 2; do
  BROOK_PREFILL_WG_STAGES=$st timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done; done
for st in 1 2; do
  BROOK_PREFILL_WG_STAGES=$st timeout 60 ./gpu-bench ttft --model llama-3-8b --input-len 8000 --kv-cache-dtype bf16 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done
python3 -c "
import json
for l in open('$OUT/ttft.jsonl'):
    d=json.loads(l); print(d['model'],d['kv_cache_dtype'],d['input_len'],'tma',d['prefill_tma'],'stages',d['prefill_wg_stages'],round(d['median_ms'],2))"
