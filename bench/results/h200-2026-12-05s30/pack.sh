#!/usr/bin/env bash
# Packs this commit's gpu-bench, cuda_kernels and cuda_e2e into .carry/gb30; then the call
# scripts here on the device with carry [".carry/gb30"].
exec "$(dirname "$0")/../../../scripts/gpu-pack.sh" .carry/gb30
