#!/usr/bin/env bash
# Session 24, call 3: where a batch-512 Llama-2-7B decode step (offline 512x128/128's steady
# state, 24.8 ms) spends the time outside its GEMMs and attention (~20 ms in gpu-bench overlap):
# decode-batch --breakdown (each kind of launch left out in turn); and the bf16 TTFT 2048
# breakdown (49.3 ms against the 42 goal).
# Carry: .carry/pack24
[ -x .carry/cuda/gpu-bench ] || tar xJf .carry/pack24/p.txz -C .carry || exit 1
cd .carry/cuda || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
timeout 240 ./gpu-bench decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --breakdown >"$OUT/breakdown.jsonl" 2>"$OUT/breakdown.log"
timeout 120 ./gpu-bench ttft --model llama-2-7b --input-len 2048 --breakdown >"$OUT/ttft-breakdown.jsonl" 2>"$OUT/ttft-breakdown.log"
grep -hv INFO "$OUT/breakdown.log" "$OUT/ttft-breakdown.log" | tail -40
