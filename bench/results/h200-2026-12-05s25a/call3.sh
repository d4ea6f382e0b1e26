#!/usr/bin/env bash
# Session 25, call 3 (not yet run; the binaries of call 2, carry [".carry/gb25"]; ~3 min):
#  1. TTFT 2048 back to back (the usual figure) against 300 ms idle before each run
#     (`--gap-ms`: a lone request at an idle server), alternated twice.
#  2. `gpu-bench cold`: a fresh backend's first prefills and first decode steps at each batch
#     size (graph capture on first use) against warm ones, without and with `--cuda-warm-up`
#     (a dummy prefill and decode step at start).
#  3. A/B of `residual_gemm` (o and down projections add into the fp32 residual on cuBLAS),
#     alternated twice: TTFT 2048 and the batch-512 decode step.
mkdir -p /tmp/gb && for b in gpu-bench; do
  xz -dc .carry/gb25/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
G=/tmp/gb/gpu-bench
for round in 1 2; do for gap in 0 300; do
  timeout 100 $G ttft --model llama-2-7b --input-len 2048 --gap-ms $gap >>"$OUT/gap_ttft.jsonl" 2>>"$OUT/gap.log"
done; done
grep -v "INFO\|BackendInfo" "$OUT/gap.log"
for w in "" --warm-up; do
  timeout 120 $G cold --model llama-2-7b $w >>"$OUT/cold.jsonl" 2>>"$OUT/cold.log"; echo "cold $w rc $?"
done
grep -v "INFO\|BackendInfo" "$OUT/cold.log"
for round in 1 2; do for rg in 0 1; do
  BROOK_RESIDUAL_GEMM=$rg timeout 100 $G ttft --model llama-2-7b --input-len 2048 >>"$OUT/ab_ttft.jsonl" 2>>"$OUT/ab.log"
  BROOK_RESIDUAL_GEMM=$rg timeout 100 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 12 >>"$OUT/ab_dec.jsonl" 2>>"$OUT/ab.log"
done; done
grep -h -o '"median_ms":[0-9.]*\|"residual_gemm":[a-z]*\|"figure":"[a-z_0-9]*"' "$OUT"/ab_*.jsonl | paste - - - | head
