#!/usr/bin/env bash
# Session 32's GPU call (NOT RUN: no device was lent in session 32). Pack with pack.sh here at the
# commit that added it, then run with carry [".carry/gb32"]; best on the H200 (needs_h200), else
# an H100; about 5 minutes. It folds in session 31's unrun call14.sh.
# 1. cuda_e2e on one thread (the new lookahead_auto variant of persistent_batch runs the gated
#    path: launched, held back and checked), then the step_io kernels.
# 2. decode-variants, each variant in its own process: default, lookahead, lookahead-auto at
#    batch 1, 128 and 3.8k tokens, two rounds. At batch 1 with no churn "auto" should keep what
#    "lookahead" keeps (gated 0) and run as fast.
# 3. The order effect (call14): three default backends in one process, with the memory pool's
#    reserved/used bytes after each drop; then the same with the pool trimmed between them.
# 4. The serving path's own time a step on the GPU: batch-1 ITL through the actors with the
#    scheduler's pre-wake and the executor's linger off (prewake_us 0) and on (300), twice
#    each, against gpu-bench's decode step.
mkdir -p /tmp/gb /tmp/o1 && for b in gpu-bench cuda_e2e cuda_kernels brook; do
  xz -dc .carry/gb32/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o1
trap 'tar czf "$OUT/call1.tgz" -C /tmp o1' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
timeout 150 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?" | tee -a $O/e2e.log
timeout 60 /tmp/gb/cuda_kernels step_io > $O/kernels.log 2>&1; echo "cuda_kernels rc $?" | tee -a $O/kernels.log
grep -h "test result\|FAILED\|panicked\|lookahead_auto" $O/e2e.log $O/kernels.log
A="decode-variants --model llama-2-7b --output-len 512 --batch 1"
for r in 1 2; do
  timeout 120 $G $A --input-len 128,3800 --variants default,lookahead,lookahead-auto >> $O/dv.jsonl 2>> $O/dv.log
done
timeout 100 $G $A --input-len 128 --variants default,default,default --same-process >> $O/same.jsonl 2>> $O/same.log
timeout 100 $G $A --input-len 128 --variants default,default,default --same-process --trim-pool >> $O/trim.jsonl 2>> $O/trim.log
printf '[scheduler]\nprewake_us = 0\n' > $O/pw0.toml; printf '[scheduler]\nprewake_us = 300\n' > $O/pw300.toml
for c in pw0 pw300 pw0 pw300; do
  echo "== $c" >> $O/itl.log
  timeout 120 /tmp/gb/brook bench --config $O/$c.toml --synthetic llama-2-7b --device cuda --num-prompts 1 --input-len 128 --output-len 512 >> $O/itl.log 2>&1
done
grep "==\|ITL" $O/itl.log
for f in dv same trim; do echo "== $f"; grep "ms/step\|memory pool" $O/$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/$f.log | grep -i error; done; true
