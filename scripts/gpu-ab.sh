#!/usr/bin/env bash
# Before/after figures in one device call: the same benchmarks from two staged builds
# (scripts/gpu-check.sh build DEST), alternated so that drift of the card hits both alike.
#
#   scripts/gpu-ab.sh BEFORE_DIR AFTER_DIR [REPEATS]   (on the GPU machine; JSON lines to $OUT/ab.jsonl)
#
# Each line of ab.jsonl is a benchmark's own JSON figure with "build": "before"|"after" and
# "commit" added. Benchmarks: gpu-bench decode (llama-2-7b, batch 1), ttft (2048 tokens),
# offline 512x128/128, and brook bench --synthetic llama-2-7b through the actors at batch 1 and
# 512x128/128.
set -uo pipefail
before=$(cd "${1:?before dir}" && pwd)
after=$(cd "${2:?after dir}" && pwd)
repeats=${3:-2}
out=${OUT:-./gpu-ab-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export BROOK_CACHE_DIR=/tmp/brook-cache RUST_LOG=${RUST_LOG:-warn}
tag() { # build commit: adds the two fields to every JSON line on stdin
    python3 -c 'import json,sys
b, c = sys.argv[1], sys.argv[2]
for l in sys.stdin:
    l = l.strip()
    if l.startswith("{"):
        d = json.loads(l); d["build"] = b; d["commit"] = c; print(json.dumps(d), flush=True)' "$1" "$2"
}
run() { # build dir: every benchmark once
    local b=$1 d=$2 c
    c=$(cat "$d/COMMIT")
    for args in "decode --model llama-2-7b --quick" "ttft --model llama-2-7b --input-len 2048" \
        "offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128"; do
        # shellcheck disable=SC2086
        "$d/gpu-bench" $args 2>>"$out/ab.err" | tag "$b" "$c" | tee -a "$out/ab.jsonl"
    done
    for args in "--num-prompts 1 --input-len 128 --output-len 256" \
        "--num-prompts 512 --input-len 128 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 8192"; do
        # shellcheck disable=SC2086
        "$d/brook" bench --synthetic llama-2-7b --device cuda $args --json 2>>"$out/ab.err" | tail -n 1 |
            tag "$b" "$c" | tee -a "$out/ab.jsonl"
    done
}
for _ in $(seq "$repeats"); do
    run before "$before"
    run after "$after"
done
