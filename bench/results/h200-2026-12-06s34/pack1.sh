#!/usr/bin/env bash
# Packs call1.sh's binaries into .carry/gb34: gpu-bench and the cuda_kernels / cuda_e2e test
# binaries of this checkout (stripped, xz), beside brook, cuda_ws and cuda_models from
# .carry/gb33 (session 33's pack4.sh, built with LookaheadMode's default moved to Auto).
# Then call1.sh on the device with carry [".carry/gb34"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release --bin gpu-bench
log=$(mktemp)
cargo test --release --test cuda_kernels --test cuda_e2e --no-run 2>&1 | tee "$log"
mkdir -p .carry/gb34
pack() { objcopy --strip-all "$1" "$log.bin" && xz -T2 -c "$log.bin" > ".carry/gb34/$2.xz"; }
pack target/release/gpu-bench gpu-bench
for t in cuda_kernels cuda_e2e; do
  pack "$(grep -o "target/release/deps/$t-[0-9a-f]*" "$log" | tail -1)" "$t"
done
for b in brook cuda_ws cuda_models; do cp .carry/gb33/$b.xz .carry/gb34/; done
rm -f "$log" "$log.bin"
ls -la .carry/gb34
