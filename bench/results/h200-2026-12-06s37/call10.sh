#!/usr/bin/env bash
# Session 37, call 10 (gpu-bench only: .carry/gb37h/base.xz = af35c18, notrig.xz = the same with
# rope_kv not triggering decode attention's launch, so attention launches once rope_kv has
# exited; carry [".carry/gb37h"]). Alternated at batch 1 (128, 3,800) and 2 and 4 (4k).
set -u
mkdir -p /tmp/gb "$OUT/o10" && for b in base notrig; do
  xz -dc .carry/gb37h/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o10
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # binary, gpu-bench args
  local b=$1; shift
  timeout 60 /tmp/gb/$b "$@" > $O/d.json 2>> $O/bench.log
  echo "$b | $* rc $?: $(grep -o '"median_ms":[0-9.]*' $O/d.json | head -1)" | tee -a $O/ab.txt
}
work() { # model
  for b in base notrig; do
    run $b decode --quick --model $1 --input-len 128 --output-len 256
    run $b decode --quick --model $1 --input-len 3800 --output-len 256
    run $b decode-batch --model $1 --batch 2 --context 4000 --steps 24
    run $b decode-batch --model $1 --batch 4 --context 4000 --steps 24
  done
}
work llama-2-7b; work llama-2-7b; work llama-3-8b
cd $OUT && tar czf o10.tgz o10 && rm -rf o10
true
