#!/usr/bin/env bash
# Packs this commit's gpu-bench, cuda_kernels and cuda_e2e into .carry/gb27; then callA.sh-callD.sh here on the
# device with carry [".carry/gb27"].
exec "$(dirname "$0")/../../../scripts/gpu-pack.sh" .carry/gb27
