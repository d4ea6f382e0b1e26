#!/usr/bin/env bash
# Session 30, call 2 (carry [".carry/gb30"]): the bulk decode kernel's ring geometry. gpu-bench
# built four times, DECODE_BULK_KEYS x DECODE_BULK_STAGES (compile.rs, passed as DB_KEYS and
# DB_STAGES) 8 x 8 (gpu-bench, call 1's), 16 x 4, 16 x 8, 8 x 16: decode attention alone at batch 1
# (4k, 16k) and 16 x 4k, lane kernel against bulk, then batch-1 decode at 3.8k and 15.8k tokens with
# BROOK_DECODE_KERNEL=bulk; the lane kernel (auto) before and after.
mkdir -p /tmp/gb /tmp/o && for b in gpu-bench gpu-bench-k16s4 gpu-bench-k16s8 gpu-bench-k8s16; do xz -dc .carry/gb30/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=/tmp/o
trap 'tar czf "$OUT/call2.tgz" -C /tmp o' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
dec() { # binary kernel model len
  BROOK_DECODE_KERNEL=$2 timeout 90 /tmp/gb/$1 decode --quick --model $3 --input-len $4 --output-len 256 >> $O/decode_$1_$2_$4.jsonl 2>> $O/decode_$1_$2_$4.log
  echo "decode $1 $2 $4: $(grep -o "\"median_ms\":[0-9.]*" $O/decode_$1_$2_$4.jsonl | tail -1)"
}
dec gpu-bench auto llama-2-7b 3800; dec gpu-bench auto llama-2-7b-16k 15800
for b in gpu-bench gpu-bench-k16s4 gpu-bench-k16s8 gpu-bench-k8s16; do
  timeout 120 /tmp/gb/$b attention --decode-only --shapes 32/32/128 --cases 4096/1,16384/1,4096/16 --variants fill8-inline,fill6-inline-bulk > $O/attn_$b.jsonl 2> $O/attn_$b.log
  grep "paged decode" $O/attn_$b.log | sed "s/paged decode /$b /; s/, rel. err.*//"
  dec $b bulk llama-2-7b 3800; dec $b bulk llama-2-7b-16k 15800
done
dec gpu-bench auto llama-2-7b 3800; dec gpu-bench auto llama-2-7b-16k 15800
