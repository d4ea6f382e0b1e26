#!/usr/bin/env bash
# Session 29, call 3 (carry [".carry/gb29"], packed by pack.sh at the gate_up_bf16 commit):
#  1. Tests of the bf16 gate|up path: cuda_kernels silu (fp32 and bf16 input) and trace; the
#     whole cuda_e2e (CUDA vs CPU now on the bf16 path by default, and the fp32 path's test).
#  2. What it saves: gpu-bench elementwise (silu_mul over fp32 vs bf16 input, the gate|up GEMM
#     writing fp32 vs bf16) at 512 and 2048 tokens; TTFT 2048 with BROOK_GATE_UP_BF16=0/1,
#     rested (--gap-ms 300) alternated twice, back to back once; decode batch 1 and offline
#     512 x 128/128 once each.
mkdir -p /tmp/gb /tmp/o && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc .carry/gb29/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call3.tgz" -C /tmp o' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
timeout 60 /tmp/gb/cuda_kernels silu trace >$O/cuda_kernels.log 2>&1; echo "cuda_kernels silu trace rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_kernels.log | head
timeout 60 $G elementwise --model llama-2-7b >$O/elementwise.jsonl 2>$O/elementwise.log; echo "elementwise rc $?"
grep "^elementwise" $O/elementwise.log
for r in 1 2; do for b in 0 1; do
  BROOK_GATE_UP_BF16=$b timeout 60 $G ttft --model llama-2-7b --input-len 2048 --gap-ms 300 >>$O/ttft_b$b.jsonl 2>>$O/ttft_b$b.log
  echo "ttft rested bf16 $b: $(grep -v 'INFO\|BackendInfo' $O/ttft_b$b.log | tail -1 | sed 's/.*idle before each: //')"
done; done
for b in 0 1; do
  BROOK_GATE_UP_BF16=$b timeout 60 $G ttft --model llama-2-7b --input-len 2048 >>$O/ttft_b2b_b$b.jsonl 2>>$O/ttft_b2b_b$b.log
  echo "ttft back to back bf16 $b: $(grep -v 'INFO\|BackendInfo' $O/ttft_b2b_b$b.log | tail -1 | sed 's/.*skipped \[\]: //')"
done
for b in 0 1; do
  BROOK_GATE_UP_BF16=$b timeout 60 $G decode --quick --model llama-2-7b --output-len 512 >>$O/decode_b$b.jsonl 2>>$O/decode_b$b.log
  echo "decode bf16 $b: $(grep -v 'INFO\|BackendInfo' $O/decode_b$b.log | tail -1 | sed 's/.*skipped \[\]: //')"
done
timeout 150 /tmp/gb/cuda_e2e >$O/cuda_e2e.log 2>&1; echo "cuda_e2e rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_e2e.log | head
for b in 0 1; do
  BROOK_GATE_UP_BF16=$b timeout 90 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 >>$O/offline_b$b.jsonl 2>>$O/offline_b$b.log
  echo "offline bf16 $b: $(tail -1 $O/offline_b$b.log)"
done
