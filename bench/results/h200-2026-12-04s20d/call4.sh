#!/usr/bin/env bash
# Session 20, call 4: the wgmma prefill kernel's TMA build (WG_TMA: warp 0 copies each K/V tile
# by cp.async.bulk.tensor through tensor maps of the cache, completing on mbarriers): prefill
# kernel tests (st2, TMA, st1, mma.sync), prefill-chunks with the TMA build as the engine's
# kernel (forced splits) and the others at the rule's splits, TTFT A/B (BROOK_PREFILL_TMA).
R=$PWD
tar xJf .carry/s20/new.txz -C /tmp && B=/tmp/s20
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
cd $B
(time timeout 240 ./cuda_kernels prefill --test-threads 2) > $OUT/tests.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log | head
BROOK_PREFILL_TMA=1 timeout 150 ./gpu-bench prefill-chunks --model llama-2-7b > $OUT/chunks.jsonl 2> $OUT/chunks.log
tail -3 $OUT/chunks.log
python3 -c "
import json
for l in open('$OUT/chunks.jsonl'):
    d=json.loads(l)
    for r in d['rows']:
        fo=r['forced_us']; best=min(list(fo.items())+[('1',r['unsplit_us'])],key=lambda x:x[1])
        print(d['model'], r['ctx'], r['chunk'], 'rule', r['splits'], 'tma unsplit', round(r['unsplit_us'],1), 'split', round(r['split_us'],1), 'best', best[0], round(best[1],1), {k[-4:]: round(v,1) for k,v in r['wg_stages_split_us'].items()})"
for i in 1 2; do for t in 0 1; do
  BROOK_PREFILL_TMA=$t timeout 60 ./gpu-bench ttft --model llama-2-7b --input-len 2048 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done; done
for t in 0 1; do
  BROOK_PREFILL_TMA=$t timeout 60 ./gpu-bench ttft --model llama-3-8b --input-len 8000 --kv-cache-dtype bf16 >> $OUT/ttft.jsonl 2>> $OUT/bench.log
done
python3 -c "
import json
for l in open('$OUT/ttft.jsonl'):
    d=json.loads(l); print(d['model'],d['quantization'],d['kv_cache_dtype'],d['input_len'],'tma',d['prefill_tma'],round(d['median_ms'],2))"
tail -3 $OUT/bench.log
