#!/usr/bin/env bash
# Session 29, call 2 (carry [".carry/gb29"], packed by pack.sh at a44119e: the ring reverted,
# decode pipelining on trial):
#  1. Decode kernel tests (call 1's timed out at 150 s compiling every build; the pipelined
#     builds now only where they change the loop: groups 1 and 2).
#  2. Decode attention A/B, BROOK_DECODE_PIPE 0 / 2 / 4: the isolated kernel (MHA 4k x 1,
#     16k x 1, 4k x 16, 1k x 1) at the serving rule (fill8-inline) and fill4-inline; then the
#     batch-1 decode step at 3,800 tokens (the kernel inside the step), alternated twice.
mkdir -p /tmp/gb /tmp/o && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc .carry/gb29/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call2.tgz" -C /tmp o' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
for p in 0 2 4 0 2 4; do
  BROOK_DECODE_PIPE=$p timeout 60 $G attention --decode-only --shapes 32/32/128 --cases 4096/1,16384/1,4096/16,1024/1 --variants fill8-inline,fill4-inline >>$O/attn_p$p.jsonl 2>>$O/attn_p$p.log
  echo "attention pipe $p rc $?"
done
for p in 0 2 4; do grep -h "paged decode" $O/attn_p$p.log | sed -E 's/ kv bf16//; s/, rel. err.*//; s/GB\/s \(//'; done
for p in 0 2 4 0 2 4; do
  BROOK_DECODE_PIPE=$p timeout 60 $G decode --quick --model llama-2-7b --input-len 3800 --output-len 256 >>$O/decode_p$p.jsonl 2>>$O/decode_p$p.log
  echo "decode pipe $p: $(grep -v 'INFO\|BackendInfo' $O/decode_p$p.log | tail -1)"
done
timeout 330 /tmp/gb/cuda_kernels paged_decode >$O/cuda_kernels_decode.log 2>&1; echo "cuda_kernels paged_decode rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_kernels_decode.log | head
