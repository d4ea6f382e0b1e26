#!/usr/bin/env bash
# Packs call3.sh's binaries into .carry/gb34c: gpu-bench, cuda_e2e and cuda_kernels of this
# checkout (stripped, xz), beside brook from .carry/gb33 (2f2dc59 with lookahead "auto" as the
# default).
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release --bin gpu-bench
log=$(mktemp)
cargo test --release --test cuda_e2e --test cuda_kernels --no-run 2>&1 | tee "$log"
mkdir -p .carry/gb34c
pack() { objcopy --strip-all "$1" "$log.bin" && xz -T2 -c "$log.bin" > ".carry/gb34c/$2.xz"; }
pack target/release/gpu-bench gpu-bench
for t in cuda_e2e cuda_kernels; do
  pack "$(grep -o "target/release/deps/$t-[0-9a-f]*" "$log" | tail -1)" "$t"
done
cp .carry/gb33/brook.xz .carry/gb34c/
rm -f "$log" "$log.bin"
ls -la .carry/gb34c
