#!/usr/bin/env bash
# Session 20, call 2: the pipelined wgmma prefill kernel (WG_STAGES 2: tile t's S and tile t-1's
# O += PV in flight together, the softmax overlapping O += PV; two K and two V tiles, 2 CTAs an
# SM): prefill kernel tests (st2, st1, mma.sync), prefill-chunks with st2 as the engine's kernel
# (forced splits) and both builds at the rule's splits, TTFT A/B (BROOK_PREFILL_WG_STAGES).
R=$PWD
tar xJf .carry/s20/new.txz -C /tmp && B=/tmp/s20
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 200 ./cuda_kernels prefill --test-threads 2) > $OUT/tests.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log | head
BROOK_PREFILL_WG_STAGES=2 timeout 120 ./gpu-bench prefill-chunks --model llama-2-7b > $OUT/chunks.jsonl 2> $OUT/chunks.log
python3 -c "
import json
for l in open('$OUT/chunks.jsonl'):
    d=json.loads(l)
    for r in d['rows']:
        fo=r['forced_us']; best=min(list(fo.items())+[('1',r['unsplit_us'])],key=lambda x:x[1])
        print(d['model'], r['ctx'], r['chunk'], 'rule', r['splits'], 'st2 unsplit', round(r['unsplit_us'],1), 'split', round(r['split_us'],1), 'best', best[0], round(best[1],1), {k[-3:]: round(v,1) for k,v in r['wg_stages_split_us'].items()})"
for i in 1 2; do for st in 1 2; do
  BROOK_PREFILL_WG_STAGES=$st timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done; done
for st in 1 2; do
  BROOK_PREFILL_WG_STAGES=$st timeout 60 ./gpu-bench ttft --model llama-3-8b --input-len 8000 --kv-cache-dtype bf16 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done
python3 -c "
import json
for l in open('$OUT/ttft.jsonl'):
    d=json.loads(l); print(d['model'],d['quantization'],d['kv_cache_dtype'],d['input_len'],'stages',d['prefill_wg_stages'],round(d['median_ms'],2))"
