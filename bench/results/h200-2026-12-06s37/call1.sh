#!/usr/bin/env bash
# Session 37, call 1 (binaries: scripts/gpu-pack.sh .carry/gb37a at e243443; carry [".carry/gb37a"]).
# Where batch 1's time outside the GEMVs goes, inside the graph: `decode-batch --breakdown` at
# batch 1 (each kind of small kernel left out in turn), two rounds, both models. On an H200
# also issue 18's goal figures (session 36's call10.sh).
set -u
P=${P:-.carry/gb37a}
mkdir -p /tmp/gb "$OUT/o1" && for b in gpu-bench cuda_e2e; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
bd() { # model context round
  timeout 120 /tmp/gb/gpu-bench decode-batch --model $1 --batch 1 --context $2 --steps 64 --breakdown \
    > $O/bd-$1-$2-$3.jsonl 2> $O/bd-$1-$2-$3.log
  echo "breakdown $1 ctx $2 round $3 rc $?"; grep -i "decode batch\|ms" $O/bd-$1-$2-$3.log | tail -12
}
for r in 1 2; do bd llama-2-7b 128 $r; done
bd llama-3-8b 128 1
if grep -q H200 $O/gpu.txt; then
  timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?"
  grep -h "test result\|FAILED\|panicked" $O/e2e.log | head -5
  run() { # args...
    timeout 60 /tmp/gb/gpu-bench "$@" > $O/d.json 2>> $O/bench.log
    echo "$* rc $?: $(grep -o '"median_ms":[0-9.]*\|"output_tok_s":[0-9.]*' $O/d.json | head -3 | tr '\n' ' ')" | tee -a $O/goals.txt
  }
  for r in 1 2; do
    run decode --quick --model llama-2-7b --output-len 256
    run decode --quick --model llama-2-7b --input-len 3800 --output-len 256
  done
  run ttft --model llama-2-7b --input-len 2048
  run offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128
  timeout 60 /tmp/gb/gpu-bench attention --decode-only --shapes 32/32/128,32/8/128 --cases 4096/1,16384/1 \
    --variants fill8-inline,fill8-cluster,fill4-k128-inline-mma,fill4-k128-cluster-mma > $O/attn.jsonl 2> $O/attn.log
  echo "attention rc $?"; grep "paged decode" $O/attn.log
fi
cd $OUT && tar czf o1.tgz o1 && rm -rf o1
true
