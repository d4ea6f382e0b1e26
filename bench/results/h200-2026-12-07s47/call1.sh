#!/usr/bin/env bash
# Session 47: the H200 measurement of the bulk gemv's tensor-core dots, still missing.
# carry [".carry/gb44a", ".carry/gb45"] (see ../h200-2026-12-07s46/call1.sh for the packs).
# On any card but an H200 it stops after nvidia-smi: six H100 calls (sessions 45-46) have the
# A/B and the ring timing already. On an H200 it runs session 46's call1.sh whole (A/B, offline,
# kernel tests, cuda_e2e) plus its deep-against-tight ring timing; outputs under $OUT/o1.
set -u
mkdir -p "$OUT/o1"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee "$OUT/o1/gpu0.txt"
grep -q H200 "$OUT/o1/gpu0.txt" || { echo "not an H200: stop"; exit 0; }
H200_ONLY=1 exec bash "$(dirname "$0")/../h200-2026-12-07s46/call1.sh"
