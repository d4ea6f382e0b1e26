#!/usr/bin/env bash
# Packs call4.sh's binaries into .carry/gb33: brook, gpu-bench and the cuda_ws / cuda_models test
# binaries of this checkout (stripped, xz). Then call4.sh on the device with carry [".carry/gb33"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release --bin brook --bin gpu-bench
log=$(mktemp)
cargo test --release --test cuda_ws --test cuda_models --no-run 2>&1 | tee "$log"
mkdir -p .carry/gb33
pack() { objcopy --strip-all "$1" "$log.bin" && xz -T2 -c "$log.bin" > ".carry/gb33/$2.xz"; }
pack target/release/brook brook
pack target/release/gpu-bench gpu-bench
for t in cuda_ws cuda_models; do
  pack "$(grep -o "target/release/deps/$t-[0-9a-f]*" "$log" | tail -1)" "$t"
done
rm -f "$log" "$log.bin"
ls -la .carry/gb33
