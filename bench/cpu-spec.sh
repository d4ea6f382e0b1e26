#!/usr/bin/env bash
# CPU speculative-decoding figures (BENCHMARKS.md, issue 12): each configuration next to its
# --speculative off twin, REPS times, with the bundled demo pair. One JSON line per run in $OUT
# ("load": the 1-minute load average at the run). With MAIN=<a build of main> every run is made
# twice in a row, main's build then $BROOK ("bin": main | branch), so every row is an A/B.
#   OUT=bench/results/<folder>/results.jsonl [MAIN=…] [REPS=5] [ONLY=regex] bench/cpu-spec.sh
# (2026-12-03: runs 1-2 in cpu-spec-2026-12-03b without MAIN, their lines written before "bin"
# was added; runs 3-4 in …c and …d with MAIN; run 5 in …e.)
set -euo pipefail
B=${BROOK:-target/release/brook}
M=${MAIN:-}
OUT=${OUT:?path of the results.jsonl to append to}
REPS=${REPS:-5}
ONLY=${ONLY:-}
D="--draft-model models/demo-chat-draft"
run() { # name, args...
  local name=$1; shift
  [[ -n "$ONLY" && ! "$name" =~ $ONLY ]] && return 0
  local line bin tag tags=(branch)
  [[ -n "$M" ]] && tags=(main branch)
  for tag in "${tags[@]}"; do
    bin=$B; [[ $tag == main ]] && bin=$M
    line=$($bin bench --device cpu --json "$@" 2>/dev/null | tail -1)
    echo "{\"name\":\"$name\",\"bin\":\"$tag\",\"load\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"report\":$line}" >> "$OUT"
    echo "$name $tag $(echo "$line" | grep -o '"output_tok_s":[0-9.]*')"
  done
}
for _ in $(seq "$REPS"); do
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
