#!/usr/bin/env bash
# Session 43, call 1 (binaries: scripts/gpu-pack.sh .carry/gb43a = dced55f; carry [".carry/gb43a"]).
# Where a batch-512 decode step's time goes with a bf16 and an fp8 (e4m3) KV cache: the step's
# launches timed in place (decode-batch --trace), decode attention alone at the offline
# workload's shapes for every variant, offline 512 x 128/128 with each cache, and ncu of the
# serving attention kernel at batch 512 x 192 keys with each cache.
set -u
P=${P:-.carry/gb43a}
mkdir -p /tmp/gb "$OUT/o1" || exit 1
for b in gpu-bench; do
  xz -dc $P/$b.xz > /tmp/gb/$b && chmod +x /tmp/gb/$b || exit 1
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=warn
export BROOK_REPO_DIR=$PWD BROOK_REQUIRE_GPU=1
O=$OUT/o1
G=/tmp/gb/gpu-bench
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $O/gpu.txt
timeout 150 $G decode-batch --model llama-2-7b --batch 512 --context 192 --steps 24 --trace --kv-cache-dtype bf16,fp8 > $O/db_l2.json 2> $O/db_l2.log; echo "decode-batch l2 rc $?"
timeout 150 $G decode-batch --model llama-3-8b --batch 512 --context 1000 --steps 24 --trace --kv-cache-dtype bf16,fp8 > $O/db_l3.json 2> $O/db_l3.log; echo "decode-batch l3 rc $?"
timeout 150 $G attention --decode-only --shapes 32/32/128,32/8/128 --cases 192/512,1000/512,4096/16 --kv-cache-dtype bf16,fp8 > $O/att.json 2> $O/att.log; echo "attention rc $?"
timeout 200 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 --kv-cache-dtype bf16,fp8 > $O/off.json 2> $O/off.log; echo "offline rc $?"
NCU=/usr/local/cuda/bin/ncu
prof() { # label kernel-regex shape variant dtype case
  echo "=== $1" >> $O/ncu.txt
  timeout 90 $NCU --clock-control none --kernel-name "regex:^$2\$" --launch-skip 3 --launch-count 1 \
    --set full $G attention --decode-only --shapes $3 --cases $6 --variants $4 --kv-cache-dtype $5 >> $O/ncu.txt 2>&1
  echo "ncu $1 rc $?"
}
prof mha-fp8-mma paged_decode_mma 32/32/128 fill6-inline-mma fp8 192/512
prof mha-bf16-lanes paged_decode 32/32/128 fill8-inline bf16 192/512
prof mha-bf16-mma paged_decode_mma 32/32/128 fill4-inline-mma bf16 192/512
grep -E "^===|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Waves Per|Theoretical Occ|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc Active" $O/ncu.txt | head -60
grep -h '"figure"' $O/off.json | grep -o '"kv_cache_dtype":"[a-z0-9]*"\|"output_tok_s":[0-9.]*\|"median_decode_step_ms":[0-9.]*' | paste - - - 
cd $OUT && gzip -9 o1/ncu.txt; true
