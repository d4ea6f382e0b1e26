#!/usr/bin/env bash
# Session 43, call 3 (binaries: scripts/gpu-pack.sh .carry/gb43c = dced55f + `attention --cases`
# taking any ctx/batch + `ahead`, the tensor-core decode kernel prefetching each pass's next keys
# into L2, off by default; carry [".carry/gb43c"]). Decode attention alone at the offline
# workload's shapes (batch 512 at 128-256 keys; Llama-3-8B's at 1000) and at batch 1/16 for
# both caches, every tensor-core variant with and without `ahead`; whole steps A/B
# (BROOK_DECODE_AHEAD=0|1): decode-batch 512 at 192 (Llama-2-7B) and 1000 (Llama-3-8B), fp8 and
# bf16, and offline 512 x 128/128 fp8; ncu of the e4m3 kernel at 512 x 192 with and without;
# then the kernel tests.
set -u
P=${P:-.carry/gb43c}
mkdir -p /tmp/gb "$OUT/o3" || exit 1
for b in gpu-bench cuda_kernels; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
G=/tmp/gb/gpu-bench
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
V=fill8-inline,fill4-inline-mma,fill6-inline-mma,fill4-inline-mma-ahead,fill6-inline-mma-ahead,fill4-k128-inline-mma,fill4-k128-inline-mma-ahead,fill4-k128-cluster-mma,fill4-k128-cluster-mma-ahead
timeout 120 $G attention --decode-only --shapes 32/32/128 --cases 128/512,192/512,256/512,1024/128,4096/1,4096/16 --variants $V --kv-cache-dtype fp8,bf16 > $O/att_mha.json 2> $O/att_mha.log; echo "attention mha rc $?"
timeout 100 $G attention --decode-only --shapes 32/8/128 --cases 1000/512,4096/1,4096/16 --variants $V --kv-cache-dtype fp8,bf16 > $O/att_gqa.json 2> $O/att_gqa.log; echo "attention gqa rc $?"
grep -h "paged decode" $O/att_mha.log $O/att_gqa.log | sed 's/, rel. err.*//' | head -120
step() { # ahead, then gpu-bench args
  local a=$1; shift
  BROOK_DECODE_AHEAD=$a timeout 100 $G "$@" > $O/s.json 2>> $O/steps.log
  echo "ahead $a | $* rc $?: $(grep -o '"median_ms":[0-9.]*\|"output_tok_s":[0-9.]*\|"median_decode_step_ms":[0-9.]*' $O/s.json | tr '\n' ' ')" | tee -a $O/ab.txt
}
for r in 1 2; do
  for a in 0 1; do
    step $a decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --kv-cache-dtype fp8
    step $a decode-batch --model llama-3-8b --batch 512 --context 1000 --steps 24 --kv-cache-dtype fp8
    step $a decode-batch --model llama-3-8b --batch 512 --context 1000 --steps 24 --kv-cache-dtype bf16
    step $a decode --quick --model llama-3-8b --input-len 3800 --output-len 256
  done
done
for a in 0 1 0 1; do
  step $a offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype fp8
done
NCU=/usr/local/cuda/bin/ncu
prof() { # label variant
  echo "=== $1" >> $O/ncu.txt
  timeout 60 $NCU --clock-control none --kernel-name "regex:^paged_decode_mma\$" --launch-skip 3 --launch-count 1 \
    --set full $G attention --decode-only --shapes 32/32/128 --cases 192/512 --variants $2 --kv-cache-dtype fp8 >> $O/ncu.txt 2>&1
  echo "ncu $1 rc $?"
}
prof mha-fp8-mma fill6-inline-mma
prof mha-fp8-mma-ahead fill6-inline-mma-ahead
grep -E "^===|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Waves Per|Warp Cycles Per Issued|Issue Slots Busy" $O/ncu.txt | head -30
gzip -9 $O/ncu.txt
timeout 240 /tmp/gb/cuda_kernels paged_decode_ahead paged_decode_fp8_batches paged_decode_mha > $O/kernels.log 2>&1; echo "cuda_kernels rc $?"
grep -h "test result\|FAILED\|panicked" $O/kernels.log | head -8
true
