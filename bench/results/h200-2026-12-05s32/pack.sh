#!/usr/bin/env bash
# Packs this commit's gpu-bench, cuda_kernels and cuda_e2e into .carry/gb32; then call1.sh on
# the device with carry [".carry/gb32"].
exec "$(dirname "$0")/../../../scripts/gpu-pack.sh" .carry/gb32
