#!/usr/bin/env bash
# Packs this commit's gpu-bench, cuda_kernels and cuda_e2e into .carry/gb31; then call14.sh on
# the device with carry [".carry/gb31"].
exec "$(dirname "$0")/../../../scripts/gpu-pack.sh" .carry/gb31
