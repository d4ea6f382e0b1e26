#!/usr/bin/env bash
# Packs call2.sh's binaries into .carry/gb34b: gpu-bench and the cuda_kernels / cuda_e2e test
# binaries of this checkout (stripped, xz). Then call2.sh with carry [".carry/gb34b"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release --bin gpu-bench
log=$(mktemp)
cargo test --release --test cuda_kernels --test cuda_e2e --no-run 2>&1 | tee "$log"
mkdir -p .carry/gb34b
pack() { objcopy --strip-all "$1" "$log.bin" && xz -T2 -c "$log.bin" > ".carry/gb34b/$2.xz"; }
pack target/release/gpu-bench gpu-bench
for t in cuda_kernels cuda_e2e; do
  pack "$(grep -o "target/release/deps/$t-[0-9a-f]*" "$log" | tail -1)" "$t"
done
rm -f "$log" "$log.bin"
ls -la .carry/gb34b
