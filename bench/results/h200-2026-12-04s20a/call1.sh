#!/usr/bin/env bash
# Session 20, call 1: the gemv L2 prefetch (BROOK_GEMV_PREFETCH_MIB, default 0 in this build):
# gemv / gemv_fp8 kernel tests with half the rows prefetching, then batch-1 decode ms/token by
# prefetch size, bf16 and fp8 weights, Llama-2-7B (ctx 128 and 4096) and Llama-3-8B.
R=$PWD
tar xJf .carry/s20/new.txz -C /tmp && B=/tmp/s20
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 120 ./cuda_kernels gemv fp8 --test-threads 4) > $OUT/tests.log 2>&1
grep -hE "test result|FAILED|panicked" $OUT/tests.log | head
dec() { # quant model input_len prefetch
  BROOK_QUANTIZATION=$1 BROOK_GEMV_PREFETCH_MIB=$4 timeout 60 ./gpu-bench decode --quick --model $2 --input-len $3 --output-len 512 >> $OUT/decode.jsonl 2>> $OUT/decode.log
}
for q in none fp8; do
  for pf in 0 8 16 24 32 48 64 0 16 32; do dec $q llama-2-7b 128 $pf; done
done
for pf in 0 16 32 0 16 32; do dec none llama-2-7b 4096 $pf; done
for pf in 0 16 32 0 16 32; do dec none llama-3-8b 128 $pf; done
python3 -c "
import json
for l in open('$OUT/decode.jsonl'):
    d=json.loads(l); print(d['model'], d['quantization'], d['input_len'], d['gemv_prefetch_mib'], round(d['median_ms'],4), round(d['mean_ms'],4))"
