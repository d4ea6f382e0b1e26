#!/usr/bin/env bash
# CPU speculative-decoding figures (BENCHMARKS.md): each configuration against speculation off,
# alternated, REPS times; one JSON line per run in results.jsonl.
set -euo pipefail
B=${BROOK:-target/release/brook}
OUT=${OUT:-bench/results/cpu-spec-2026-12-03b/results.jsonl}
REPS=${REPS:-3}
D="--draft-model models/demo-chat-draft"
run() { # name, args...
  local name=$1; shift
  local line
  line=$($B bench --device cpu --json "$@" 2>/dev/null | tail -1)
  echo "{\"name\":\"$name\",\"load\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"report\":$line}" >> "$OUT"
  echo "$name $(echo "$line" | grep -o '"output_tok_s":[0-9.]*')"
}
for r in $(seq "$REPS"); do
  S1="--num-prompts 1 --input-len 64 --output-len 256"
  run single_greedy_off $S1 --speculative off
  run single_greedy_draft $S1 $D
  run single_greedy_draft_fixed4 $S1 $D --spec-fixed-depth
  run single_t07_off $S1 --temperature 0.7 --speculative off
  run single_t07_draft $S1 --temperature 0.7 $D
  run single_t07_draft_fixed4 $S1 --temperature 0.7 $D --spec-fixed-depth
  S64="--num-prompts 64 --input-len 64 --output-len 64"
  run batch64_off $S64 --speculative off
  run batch64_draft $S64 $D
  R="--num-prompts 1 --input-len 128 --output-len 256 --prompts repeat"
  run repeat_single_off $R --speculative off
  run repeat_single_ngram $R --speculative ngram
  R16="--num-prompts 16 --input-len 128 --output-len 128 --prompts repeat"
  run repeat_b16_off $R16 --speculative off
  run repeat_b16_ngram $R16 --speculative ngram
done
