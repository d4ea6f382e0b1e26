#!/usr/bin/env bash
# Builds and packs this commit's gpu-bench and GPU test binaries into .carry/gb28 (stripped, xz:
# the tree and the carry must stay under 64 MiB together). Run here, then call1.sh (and later calls)
# on the device with carry [".carry/gb28"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release --bin gpu-bench
cargo test --release --test cuda_kernels --test cuda_e2e --no-run 2>&1 | tee /tmp/pack28.log
mkdir -p .carry/gb28
pack() { objcopy --strip-all "$1" /tmp/pack28.bin && xz -T2 -c /tmp/pack28.bin > ".carry/gb28/$2.xz"; }
pack target/release/gpu-bench gpu-bench
for t in cuda_kernels cuda_e2e; do
  pack "$(grep -o "target/release/deps/$t-[0-9a-f]*" /tmp/pack28.log | tail -1)" "$t"
done
ls -la .carry/gb28
