#!/usr/bin/env bash
# Builds and packs this checkout's gpu-bench and GPU test binaries (cuda_kernels, cuda_e2e) into
# DEST (stripped, xz: the tree and the carry must stay under 64 MiB together), for device calls
# with carry [DEST]. Usage: scripts/gpu-pack.sh .carry/NAME
set -euo pipefail
dest=${1:?usage: scripts/gpu-pack.sh .carry/NAME}
cd "$(dirname "$0")/.."
log=$(mktemp)
cargo build --release --bin gpu-bench
cargo test --release --test cuda_kernels --test cuda_e2e --no-run 2>&1 | tee "$log"
mkdir -p "$dest"
pack() { objcopy --strip-all "$1" "$log.bin" && xz -T2 -c "$log.bin" > "$dest/$2.xz"; }
pack target/release/gpu-bench gpu-bench
for t in cuda_kernels cuda_e2e; do
  pack "$(grep -o "target/release/deps/$t-[0-9a-f]*" "$log" | tail -1)" "$t"
done
rm -f "$log" "$log.bin"
ls -la "$dest"
