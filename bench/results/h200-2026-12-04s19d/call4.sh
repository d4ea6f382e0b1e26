#!/usr/bin/env bash
# Session 19, call 4: the wgmma prefill kernel over e4m3 caches too (staged, widened in shared
# memory): prefill kernel tests, CUDA-vs-CPU tests, TTFT A/B (wgmma vs mma.sync) for Llama-3-8B at
# 2,048 (fp8 weights + fp8 KV) and 8,000 tokens (bf16, and fp8 + fp8), offline 1000 x 1000 fp8 + fp8 A/B.
R=$PWD
tar xJf .carry/s19/new.txz -C /tmp && B=/tmp/s19
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache BROOK_REQUIRE_GPU=1 RUST_LOG=warn
export BROOK_E2E_MODEL=$R/models/demo-chat BROOK_REPO_DIR=$R
cd $B
(time timeout 150 ./cuda_kernels prefill --test-threads 2) > $OUT/tests.log 2>&1
grep -E "test result|FAILED|panicked" $OUT/tests.log | head
(time timeout 100 ./cuda_e2e --test-threads=1) > $OUT/e2e.log 2>&1
grep -E "test result|FAILED|panicked" $OUT/e2e.log | head
t() { for w in 1 0; do BROOK_PREFILL_WGMMA=$w timeout 60 ./gpu-bench ttft "$@" >> $OUT/ttft.jsonl 2>> $OUT/bench.log; done; }
BROOK_QUANTIZATION=fp8 t --model llama-3-8b --input-len 2048 --kv-cache-dtype fp8
t --model llama-3-8b --input-len 8000 --kv-cache-dtype bf16
BROOK_QUANTIZATION=fp8 t --model llama-3-8b --input-len 8000 --kv-cache-dtype fp8
BROOK_QUANTIZATION=fp8 t --model llama-3-8b --input-len 2048 --kv-cache-dtype fp8
python3 -c "
import sys,json
for l in open('$OUT/ttft.jsonl'):
    d=json.loads(l); print(d['model'],d['quantization'],d['kv_cache_dtype'],d['input_len'],'wgmma' if d['prefill_wgmma'] else 'mma.sync',round(d['median_ms'],2))"
for w in 1 0; do BROOK_PREFILL_WGMMA=$w BROOK_QUANTIZATION=fp8 timeout 110 ./gpu-bench offline --model llama-3-8b --num-prompts 1000 --input-len 1000 --output-len 1000 --max-num-seqs 1024 --kv-cache-dtype fp8 >> $OUT/offline.jsonl 2>> $OUT/bench.log; done
cut -c1-400 $OUT/offline.jsonl
