#!/usr/bin/env bash
# Packs this commit's gpu-bench, cuda_kernels and cuda_e2e into .carry/gb25; then call2.sh, call3.sh and call4.sh here on the
# device with carry [".carry/gb25"].
exec "$(dirname "$0")/../../../scripts/gpu-pack.sh" .carry/gb25
