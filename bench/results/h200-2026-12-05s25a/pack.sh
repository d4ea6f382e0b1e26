#!/usr/bin/env bash
# Builds and packs this commit's gpu-bench and GPU test binaries into .carry/gb25 (stripped, xz:
# the tree and the carry must stay under 64 MiB together). Run here, then call2.sh, call3.sh and call4.sh
# on the device with carry [".carry/gb25"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release --bin gpu-bench
cargo test --release --test cuda_kernels --test cuda_e2e --no-run 2>&1 | tee /tmp/pack25.log
mkdir -p .carry/gb25
pack() { objcopy --strip-all "$1" /tmp/pack25.bin && xz -T2 -c /tmp/pack25.bin > ".carry/gb25/$2.xz"; }
pack target/release/gpu-bench gpu-bench
for t in cuda_kernels cuda_e2e; do
  pack "$(grep -o "target/release/deps/$t-[0-9a-f]*" /tmp/pack25.log | tail -1)" "$t"
done
ls -la .carry/gb25
