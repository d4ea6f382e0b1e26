#!/usr/bin/env bash
# Session 36, call 3. A = .carry/gb36a (7620bcb), B = .carry/gb36b (the wide split merge:
# 16-byte partial loads, a head's splits shared among threads, lane kernel held at 8 CTAs an SM).
# carry [".carry/gb36a", ".carry/gb36b"]. B's decode kernel tests and cuda_e2e; then A/B
# alternated: the lone decode kernel (global merge) at batch 1-8, and decode steps through the
# graph where the global merge serves (batch 2-16 at 4k tokens) and at batch 1 (cluster: same code).
set -u
mkdir -p /tmp/A /tmp/B "$OUT/o3"
for v in A:gb36a B:gb36b; do for b in gpu-bench cuda_kernels cuda_e2e; do
  [ ${v%%:*} = A ] && [ $b != gpu-bench ] && continue
  xz -dc .carry/${v##*:}/$b.xz > /tmp/${v%%:*}/$b && chmod +x /tmp/${v%%:*}/$b || exit 1
done; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 200 /tmp/B/cuda_kernels paged_decode_inline_merge paged_decode_filled_splits paged_decode_fp8_batches \
  paged_decode_gqa paged_decode_sliding paged_decode_mha > $O/tests.log 2>&1; echo "cuda_kernels rc $?"
timeout 120 /tmp/B/cuda_e2e --test-threads 1 >> $O/tests.log 2>&1; echo "cuda_e2e rc $?"
grep -h "test result\|FAILED\|panicked" $O/tests.log | head -10
for r in 1 2; do for v in A B; do
  timeout 60 /tmp/$v/gpu-bench attention --decode-only --shapes 32/32/128,32/8/128 \
    --cases 4096/1,16384/1,4096/2,4096/4,4096/8,16384/4 \
    --variants fill8-inline,fill4-inline-mma,fill4-k128-inline-mma >> $O/attn_$v.jsonl 2>> $O/attn.log
  echo "attention $v rc $?"
done; done
run() { # label binary args...
  local l=$1 b=$2; shift 2
  timeout 45 /tmp/$b/gpu-bench "$@" > $O/d.json 2>> $O/decode.log
  echo "$* | $l rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json)" | tee -a $O/decode.txt
}
for r in 1 2; do
  for MB in llama-3-8b:2 llama-3-8b:4 llama-3-8b:8 llama-3-8b:16 llama-2-7b:2 llama-2-7b:4; do
    M=${MB%%:*}; N=${MB##*:}
    run A A decode-batch --model $M --batch $N --context 4000
    run B B decode-batch --model $M --batch $N --context 4000
  done
  run A A decode --quick --model llama-3-8b --input-len 3800 --output-len 256
  run B B decode --quick --model llama-3-8b --input-len 3800 --output-len 256
done
true
