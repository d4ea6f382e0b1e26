#!/usr/bin/env bash
# Session 37, call 11 (binaries: .carry/gb37f, the default's code; carry [".carry/gb37f"]): the
# batch-1 breakdown at the new default (SiLU with PDL), 128 and 3,800 tokens, both models.
set -u
P=${P:-.carry/gb37f}
mkdir -p /tmp/gb "$OUT/o11" && for b in gpu-bench; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o11
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
for m in llama-2-7b llama-3-8b; do
  for c in 128 3800; do
    timeout 120 /tmp/gb/gpu-bench decode-batch --model $m --batch 1 --context $c --steps 64 --breakdown \
      > $O/bd-$m-$c.jsonl 2> $O/bd-$m-$c.log
    echo "breakdown $m $c rc $?"; grep "decode batch" $O/bd-$m-$c.log | sed 's/ (GPU.*//'
  done
done
cd $OUT && tar czf o11.tgz o11 && rm -rf o11
true
