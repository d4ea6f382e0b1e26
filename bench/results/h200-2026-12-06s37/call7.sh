#!/usr/bin/env bash
# Session 37, call 7 (binaries: .carry/gb37f, as call 6; carry [".carry/gb37f"]): issue 18's goal
# figures at this build (session 36's call10.sh without its cuda_e2e, which call 6 ran).
set -u
P=${P:-.carry/gb37f}
mkdir -p /tmp/gb "$OUT/o7" && for b in gpu-bench; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o7
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
run() { # gpu-bench args
  timeout 90 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
  echo "$* rc $?: $(grep -o '"median_ms":[0-9.]*\|"output_tok_s":[0-9.]*\|"ttft_ms[a-z_]*":[0-9.]*' $O/d.json | head -3 | tr '\n' ' ')" | tee -a $O/goals.txt
}
run decode --quick --model llama-2-7b --output-len 256
run ttft --model llama-2-7b --input-len 2048
run offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128
timeout 60 /tmp/gb/gpu-bench attention --decode-only --shapes 32/32/128,32/8/128 --cases 4096/1,16384/1 \
  --variants fill8-inline,fill8-cluster,fill4-k128-inline-mma,fill4-k128-cluster-mma > $O/attn.jsonl 2> $O/attn.log
echo "attention rc $?"; grep "paged decode" $O/attn.log
run decode --quick --model llama-2-7b --output-len 256
cd $OUT && tar czf o7.tgz o7 && rm -rf o7
true
