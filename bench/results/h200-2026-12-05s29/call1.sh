#!/usr/bin/env bash
# Session 29, call 1 (carry [".carry/gb29"], packed by pack.sh at 01600f0):
#  1. Kernel tests of the two new builds: the prefill kernel's TMA ring of three tiles
#     (WG_STAGES 3) beside every other build, and the lane decode kernel's pipelined loop
#     (DECODE_PIPE 2 and 4) beside the plain one, on every decode case.
#  2. Prefill attention A/B, ring (3) against one K and one V tile (1): prefill-chunks, then
#     TTFT 2048 rested (--gap-ms 300), alternated twice.
#  3. Decode attention A/B, BROOK_DECODE_PIPE 0 / 2 / 4: the isolated kernel (MHA 4k x 1,
#     16k x 1, 4k x 16, 1k x 1) at the serving rule (fill8-inline) and fill4-inline; then the
#     batch-1 decode step at 128 and 3,800 tokens (the kernel inside the step).
mkdir -p /tmp/gb /tmp/o && for b in gpu-bench cuda_e2e cuda_kernels; do
  xz -dc .carry/gb29/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call1.tgz" -C /tmp o' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
# A failing (or hanging) build is not timed: its A/B runs are skipped.
timeout 150 /tmp/gb/cuda_kernels prefill >$O/cuda_kernels_prefill.log 2>&1; RP=$?; echo "cuda_kernels prefill rc $RP"
grep -E "test result|FAILED|panicked" $O/cuda_kernels_prefill.log | head
timeout 150 /tmp/gb/cuda_kernels paged_decode >$O/cuda_kernels_decode.log 2>&1; RD=$?; echo "cuda_kernels paged_decode rc $RD"
grep -E "test result|FAILED|panicked" $O/cuda_kernels_decode.log | head
if [ $RP = 0 ]; then for s in 1 3 1 3; do
  BROOK_PREFILL_WG_STAGES=$s timeout 60 $G prefill-chunks --model llama-2-7b >>$O/chunks_st$s.jsonl 2>>$O/chunks_st$s.log
  echo "chunks st$s rc $?"
done
for r in 1 2; do for s in 1 3; do
  BROOK_PREFILL_WG_STAGES=$s timeout 60 $G ttft --model llama-2-7b --input-len 2048 --gap-ms 300 >>$O/ttft_st$s.jsonl 2>>$O/ttft_st$s.log
  echo "ttft st$s: $(grep -v 'INFO\|BackendInfo' $O/ttft_st$s.log | tail -1)"
done; done; fi
if [ $RD = 0 ]; then for p in 0 2 4 0; do
  BROOK_DECODE_PIPE=$p timeout 60 $G attention --decode-only --shapes 32/32/128 --cases 4096/1,16384/1,4096/16,1024/1 --variants fill8-inline,fill4-inline >>$O/attn_p$p.jsonl 2>>$O/attn_p$p.log
  echo "attention pipe $p rc $?"
done
grep -h "paged decode" $O/attn_p*.log | head -40
for p in 0 2 4 0 2 4; do
  BROOK_DECODE_PIPE=$p timeout 60 $G decode --quick --model llama-2-7b --input-len 3800 --output-len 256 >>$O/decode_p$p.jsonl 2>>$O/decode_p$p.log
  echo "decode pipe $p: $(grep -v 'INFO\|BackendInfo' $O/decode_p$p.log | tail -1)"
done; fi
