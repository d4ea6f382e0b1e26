#!/usr/bin/env bash
# Session 30, call 1 (carry [".carry/gb30"]): the bulk-copy decode kernel (paged_decode_bulk.cu).
# Its kernel tests and CUDA-vs-CPU test, then decode attention alone (lane kernel at the serving
# fill against the bulk kernel at fills 4/6/8) and batch-1 decode of Llama-2-7B at 128, 3.8k and
# 7.9k and 15.8k tokens (the last two on llama-2-7b-16k) with BROOK_DECODE_KERNEL=auto (lanes)
# and bulk.
mkdir -p /tmp/gb /tmp/o && for b in gpu-bench cuda_kernels cuda_e2e; do xz -dc .carry/gb30/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call1.tgz" -C /tmp o' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
timeout 240 /tmp/gb/cuda_kernels paged_decode > $O/kernels.log 2>&1; echo "cuda_kernels paged_decode rc $?: $(grep 'test result' $O/kernels.log)"
grep -E "FAILED|panicked" $O/kernels.log | head -5
timeout 240 /tmp/gb/cuda_e2e --test-threads 1 bulk_decode mha_hd128 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?: $(grep 'test result' $O/e2e.log)"
grep -E "FAILED|panicked|eager:|graphs:" $O/e2e.log | head -12
timeout 200 $G attention --decode-only --shapes 32/32/128,32/8/128 --cases 1024/1,4096/1,16384/1,4096/16,16384/16,4096/64 --variants fill8-inline,fill4-inline-bulk,fill6-inline-bulk,fill8-inline-bulk > $O/attn.jsonl 2> $O/attn.log
grep "paged decode" $O/attn.log | sed 's/paged decode //'
for ML in llama-2-7b:128 llama-2-7b:3800 llama-2-7b-16k:7900 llama-2-7b-16k:15800; do M=${ML%:*} L=${ML#*:}; for k in auto bulk; do
  BROOK_DECODE_KERNEL=$k timeout 90 $G decode --quick --model $M --input-len $L --output-len 256 >> $O/decode_${k}_$L.jsonl 2>> $O/decode_${k}_$L.log
  echo "decode $L $k: $(grep -o "\"median_ms\":[0-9.]*" $O/decode_${k}_$L.jsonl | tail -1)"
done; done
