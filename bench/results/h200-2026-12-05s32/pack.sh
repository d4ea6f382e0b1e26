#!/usr/bin/env bash
# Packs this commit's gpu-bench, cuda_kernels and cuda_e2e into .carry/gb32, and brook itself
# (for the pre-wake check); then call1.sh on the device with carry [".carry/gb32"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
scripts/gpu-pack.sh .carry/gb32
cargo build --release --bin brook
objcopy --strip-all target/release/brook /tmp/brook-stripped
xz -T2 -c /tmp/brook-stripped > .carry/gb32/brook.xz
ls -la .carry/gb32
