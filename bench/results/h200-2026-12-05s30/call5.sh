#!/usr/bin/env bash
# Session 30, call 5 (carry [".carry/gb30"], call 1's gpu-bench): the GPU timeline of decode
# steps with pinned I/O against the default (nsys, if the device has it): copies and kernels
# between two steps' graphs.
mkdir -p /tmp/gb /tmp/o && xz -dc .carry/gb30/gpu-bench.xz > /tmp/gb/gpu-bench && chmod +x /tmp/gb/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o
trap 'tar czf "$OUT/call5.tgz" -C /tmp o' EXIT
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: $NSYS"; [ -n "$NSYS" ] || { ls /usr/local/cuda/bin | tee $O/cuda_bin.txt; exit 0; }
for v in default pinned; do
  timeout 150 $NSYS profile --trace cuda --cuda-graph-trace node -o /tmp/o/$v --force-overwrite true $G decode-variants --model llama-2-7b --input-len 128 --output-len 64 --batch 1 --variants $v > $O/nsys_$v.log 2>&1
  timeout 120 $NSYS stats --report cuda_gpu_trace --format csv -o /tmp/o/$v /tmp/o/$v.nsys-rep > /dev/null 2>&1
  rm -f /tmp/o/$v.sqlite
  ls /tmp/o | grep $v
  # The last 2 steps' non-layer work: copies and small kernels, by name and duration.
  f=$(ls /tmp/o/${v}_cuda_gpu_trace*.csv 2>/dev/null | head -1)
  [ -n "$f" ] && tail -700 "$f" | grep -iv "gemv\|paged_decode\|rmsnorm\|rope_kv\|silu" | tail -25
done
