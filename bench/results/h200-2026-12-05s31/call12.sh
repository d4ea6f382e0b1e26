#!/usr/bin/env bash
# Session 31, call 12 (carry [".carry/gb31"]: this build's gpu-bench, cuda_kernels, cuda_e2e):
# the pinned path with both of calls 9-11's remedies built in: the metadata loaded by a kernel
# (copy_in) from the mapped stage, and the host napping 20 µs between looks at the flag while a
# later step is queued (lookahead), spinning otherwise. Tests: cuda_kernels step_io, cuda_e2e on
# one thread. Then decode-variants batch 1 at 128 and 3.8k tokens (default / pinned /
# lookahead, two rounds), and offline 512 x 128/128 (untimed against lookahead).
mkdir -p /tmp/gb /tmp/o12 && for b in gpu-bench cuda_kernels cuda_e2e; do xz -dc .carry/gb31/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
G=/tmp/gb/gpu-bench O=/tmp/o12
trap 'tar czf "$OUT/call12.tgz" -C /tmp o12' EXIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee $O/gpu.txt
timeout 60 /tmp/gb/cuda_kernels step_io > $O/kernels.log 2>&1; echo "cuda_kernels step_io rc $?: $(grep 'test result' $O/kernels.log)"
A="decode-variants --model llama-2-7b --output-len 512 --batch 1 --variants default,pinned,lookahead"
for r in 1 2; do
  timeout 100 $G $A --input-len 128 >> $O/dv128.jsonl 2>> $O/dv128.log
  timeout 100 $G $A --input-len 3800 >> $O/dv3800.jsonl 2>> $O/dv3800.log
done
for f in dv128 dv3800; do echo "== $f"; grep "ms/step" $O/$f.log | sed 's/.*llama-2-7b decode //; s/; host prepare.*lookahead/; lookahead/'; tail -3 $O/$f.log | grep -i error; done
timeout 120 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --variants untimed,lookahead > $O/offline.jsonl 2> $O/offline.log
grep -i "tok/s\|error" $O/offline.log | tail -4
timeout 240 /tmp/gb/cuda_e2e --test-threads 1 > $O/e2e.log 2>&1; echo "cuda_e2e rc $?: $(grep 'test result' $O/e2e.log)"
grep -E "FAILED|panicked|^test .*\.\.\. [a-z]" $O/e2e.log | grep -v " ok$" | head -10; true
