#!/usr/bin/env bash
# Runs loadtest/longtail_ws.js against `brook serve` (CPU demo model, configs/cpu-longtail.toml)
# once per policy at the same arrival rate, and prints each run's summary (SLO attainment over
# every arrival: dropped and unfinished requests count as misses).
# Usage: scripts/longtail-compare.sh RATE [DURATION] [POLICIES]
# Env: BROOK_BIN (default target/release/brook), OUT_DIR (default target/longtail), CONFIG
# (default configs/cpu-longtail.toml); k6 reads SHORT_TTFT_MS and the other SLO variables from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:?arrival rate, requests/s}
DURATION=${2:-60s}
POLICIES=${3:-"fcfs adaptive"}
OUT=${OUT_DIR:-target/longtail}
BIN=${BROOK_BIN:-target/release/brook}
CONFIG=${CONFIG:-configs/cpu-longtail.toml}
mkdir -p "$OUT"
for policy in $POLICIES; do
  log="$OUT/serve-$policy.log"
  # Removed first: the port is read from this log, and the server truncates it only once started.
  rm -f "$log"
  "$BIN" serve --device cpu --port 0 --config "$CONFIG" --policy "$policy" >"$log" 2>&1 &
  pid=$!
  port=""
  for _ in $(seq 1 300); do
    [ -f "$log" ] && port=$(sed -n 's/.*brook listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$log" | head -n1)
    [ -n "$port" ] && break
    sleep 0.2
  done
  [ -n "$port" ] || { cat "$log"; kill $pid; exit 1; }
  k6 run --quiet -e BROOK_URL="ws://127.0.0.1:$port/v1/ws" -e RATE="$RATE" -e DURATION="$DURATION" \
    -e LONG_WORDS_MIN="${LONG_WORDS_MIN:-300}" -e LONG_WORDS_MAX="${LONG_WORDS_MAX:-600}" \
    -e UNIQUE_DOCS="${UNIQUE_DOCS:-0}" \
    -e SUMMARY_JSON="$OUT/k6-$policy-$RATE.json" loadtest/longtail_ws.js >/dev/null 2>"$OUT/k6-$policy.err" || true
  curl -fsS "http://127.0.0.1:$port/metrics" >"$OUT/metrics-$policy-$RATE.txt" || true
  kill $pid; wait $pid 2>/dev/null || true
  echo "== $policy @ $RATE req/s"
  # Attainment over every arrival: k6's dropped arrivals and requests cut off at the end count
  # as misses (scripts/slo_report.py).
  python3 scripts/slo_report.py line "$OUT/k6-$policy-$RATE.json"
done
