#!/usr/bin/env bash
# Session 42 call 2, run as session 43 call 2 (only on an H200; binaries .carry/gb43a = dced55f; any pack of main's
# gpu-bench works: scripts/gpu-pack.sh .carry/gb43a, carry [".carry/gb43a"]): stream-floor (its
# "ring + loads" row answers whether the bulk gemv's arithmetic costs the H200 its one-launch
# rate, session 40) and decode tight vs deep (the deep ring, session 41, was measured on H100s
# only), alternated twice.
set -u
mkdir -p /tmp/gb "$OUT/o2" || exit 1
for b in gpu-bench; do
  [ -x /tmp/gb/$b ] || { xz -dc .carry/gb43a/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b; } || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o2
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
grep -q H200 $O/gpu.txt || { echo 'not an H200: nothing to run'; cd $OUT && tar czf o2.tgz o2; exit 0; }
run() { # variant (tight | deep), then gpu-bench args
  local t=$1; shift
  BROOK_GEMV_SMEM=$t timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$t | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
timeout 90 /tmp/gb/gpu-bench stream-floor --model llama-2-7b > $O/floor.json 2> $O/floor.log
echo "stream-floor rc $?"; grep -h "ms" $O/floor.log | tail -14
for r in 1 2; do
  for t in tight deep; do
    run $t decode --quick --model llama-2-7b --output-len 256
    run $t decode --quick --model llama-3-8b --output-len 256
  done
done
cd $OUT && tar czf o2.tgz o2 && rm -rf o2
true
