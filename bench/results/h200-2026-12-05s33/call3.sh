#!/usr/bin/env bash
# Session 33: calls 1 and 2 folded into one (device time was short after many refused starts),
# most important first. Carry [".carry/gb32"] (session 32's binaries by its pack.sh; brook and
# gpu-bench rebuilt at session 33's commits: bench's executor figures, gpu-bench stream-floor).
# 1. cuda_e2e on one thread (the lookahead_auto variant runs the gated path), step_io kernels.
# 2. Serving batch 1 through the actors: pre-wake off / on, and lookahead auto with pre-wake;
#    each also with the scheduler on a thread of its own (brook-own).
# 3. decode-variants default / lookahead / lookahead-auto at 128 and 3.8k tokens, one round.
# 4. gpu-bench stream-floor: one token's weights in one launch against one a matrix.
# 5. 512 x 128/128 through the actors, pre-wake off / on / on with brook-own, and gpu-bench
#    offline beside them.
set -u
mkdir -p /tmp/gb "$OUT/o3" && for b in gpu-bench cuda_e2e cuda_kernels brook brook-own; do
  xz -dc .carry/gb32/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=$OUT/o3  # logs straight under $OUT: they come back even if the call is cut
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
timeout 120 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?" | tee -a $O/e2e.log
timeout 40 /tmp/gb/cuda_kernels step_io > $O/kernels.log 2>&1; echo "cuda_kernels rc $?" | tee -a $O/kernels.log
grep -h "test result\|FAILED\|panicked\|lookahead_auto" $O/e2e.log $O/kernels.log
printf '[scheduler]\nprewake_us = 0\n' > $O/pw0.toml; printf '[scheduler]\nprewake_us = 300\n' > $O/pw300.toml
S="bench --synthetic llama-2-7b --device cuda"
# brook-own: the scheduler actor on a thread of its own (session 33's experiment).
for c in "brook pw0 off" "brook pw300 off" "brook-own pw300 off" "brook pw300 auto" "brook-own pw300 auto" "brook pw300 off" "brook-own pw300 off"; do
  set -- $c
  echo "== $1 $2 lookahead $3" >> $O/itl.log
  timeout 60 /tmp/gb/$1 $S --config $O/$2.toml --cuda-lookahead $3 --num-prompts 1 --input-len 128 --output-len 512 >> $O/itl.log 2>&1
done
grep "==\|ITL\|executor\|rror" $O/itl.log
timeout 150 $G decode-variants --model llama-2-7b --output-len 512 --batch 1 --input-len 128,3800 --variants default,lookahead,lookahead-auto >> $O/dv.jsonl 2>> $O/dv.log
grep "ms/step\|rror" $O/dv.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'
timeout 60 $G stream-floor --model llama-2-7b > $O/floor.jsonl 2> $O/floor.log
grep "stream floor\|rror" $O/floor.log
for c in "brook pw0" "brook pw300" "brook-own pw300"; do
  set -- $c
  echo "== $1 $2" >> $O/b512.log
  timeout 50 /tmp/gb/$1 $S --config $O/$2.toml --num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192 >> $O/b512.log 2>&1
done
grep "==\|ITL\|out tok\|executor\|rror" $O/b512.log
timeout 40 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 > $O/offline.jsonl 2> $O/offline.log
grep -i "out tok\|rror" $O/offline.log | tail -3
