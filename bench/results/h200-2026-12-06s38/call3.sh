#!/usr/bin/env bash
# Session 38, call 3 (binaries .carry/gb38c: the fused kernel's producer rewritten, one copy a
# stage but where a stage crosses runs, the runs in shared memory; carry [".carry/gb38c",
# ".carry/gb37l"]): the several-heads test under compute-sanitizer, the gemv_bulk tests, then
# batch-1 decode off / early / late beside the baseline, and the breakdown's "all but linear".
set -u
mkdir -p /tmp/gb /tmp/base "$OUT/o3" || exit 1
for b in gpu-bench cuda_kernels; do
  xz -dc .carry/gb38c/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
xz -dc .carry/gb37l/gpu-bench.xz > /tmp/base/gpu-bench && chmod +x /tmp/base/gpu-bench || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o3
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 4 /tmp/gb/cuda_kernels gemv_bulk_rope_ranges --test-threads 1 > $O/sanitizer.log 2>&1
echo "sanitizer rc $?"; grep -m16 -E "Invalid|at 0x|by thread|Address|ERROR SUMMARY|test result|panicked" $O/sanitizer.log
timeout 120 /tmp/gb/cuda_kernels gemv_bulk --test-threads 1 > $O/kernels.log 2>&1; echo "cuda_kernels gemv_bulk rc $?"
grep -h "^test \|test result" $O/kernels.log | head -12
run() { # label, binary, gpu-bench args
  local l=$1 b=$2; shift 2
  timeout 60 $b "$@" > $O/d.json 2>> $O/bench.log
  echo "$l | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/decode.txt
}
for r in 1 2; do
  run base /tmp/base/gpu-bench decode --quick --model llama-2-7b --output-len 256
  for q in 0 2; do
    BROOK_QKV_ROPE=$q run qkv_rope=$q /tmp/gb/gpu-bench decode --quick --model llama-2-7b --output-len 256
  done
done
for q in 0 2; do
  BROOK_QKV_ROPE=$q timeout 120 /tmp/gb/gpu-bench decode-batch --model llama-2-7b --batch 1 --context 128 --steps 64 --breakdown > $O/bd$q.json 2> $O/bd$q.log
  echo "breakdown qkv_rope=$q rc $?"; grep -o "skipped \[.*ms a step" $O/bd$q.log | tail -9
done
cd $OUT && tar czf o3.tgz o3 && rm -rf o3
true
