#!/usr/bin/env bash
# Soak test (issue 17): `brook serve` (the bundled demo model, CPU) under loadtest/soak_ws.js — a
# long-tail mix with ~10 KB documents, clients that disconnect mid-stream, cancels, slow readers
# and malformed messages — while the server's RSS is sampled every RSS_EVERY seconds. Then:
#   - k6's own checks: every non-malformed request met its expectation, every malformed message
#     got its error (soak_ok, soak_malformed_answered, no unexpected error frame);
#   - /metrics: 0 requests running or waiting, 0 KV blocks held (the prefix cache holds only
#     free blocks), 0 sockets open, no unread output, and no error code but the malformed ones';
#   - RSS flat: after the warm-up (the first WARMUP_PCT % of samples: the KV pool's pages are
#     touched as blocks are first used), the largest sample is within RSS_TOLERANCE_PCT % of the
#     smallest.
# Usage: scripts/soak.sh                      full run: ITERATIONS=10000 requests
#        DURATION=60s scripts/soak.sh         the short version (.ci/run)
# Env: ITERATIONS, DURATION, VUS (24), BROOK_BIN (target/release/brook), OUT_DIR (a temp dir;
# keeps rss.txt, metrics.txt, summary.json, server.log), RSS_EVERY (2), WARMUP_PCT (20),
# RSS_TOLERANCE_PCT (10), SERVE_ARGS (extra flags for brook serve).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BROOK_BIN:-target/release/brook}
VUS=${VUS:-24}
DURATION=${DURATION:-}
ITERATIONS=${ITERATIONS:-}
[ -z "$DURATION" ] && [ -z "$ITERATIONS" ] && ITERATIONS=10000
RSS_EVERY=${RSS_EVERY:-2}
WARMUP_PCT=${WARMUP_PCT:-20}
RSS_TOLERANCE_PCT=${RSS_TOLERANCE_PCT:-10}
OUT_DIR=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/server.log"
RSS="$OUT_DIR/rss.txt"
: >"$RSS"

# shellcheck disable=SC2086
"$BIN" serve --device cpu --port 0 ${SERVE_ARGS:-} >"$LOG" 2>&1 &
PID=$!
SAMPLER=""
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
}
trap cleanup EXIT

PORT=""
for _ in $(seq 1 600); do
  PORT=$(sed -n 's/.*brook listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$LOG" | head -n1)
  [ -n "$PORT" ] && break
  kill -0 "$PID" 2>/dev/null || { cat "$LOG"; echo "brook serve exited early"; exit 1; }
  sleep 0.2
done
[ -n "$PORT" ] || { cat "$LOG"; echo "brook serve did not start"; exit 1; }
BASE="http://127.0.0.1:$PORT"

# RSS in KiB, one sample per line: "<seconds since start> <kib>".
(
  t0=$(date +%s)
  while kill -0 "$PID" 2>/dev/null; do
    kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$PID/status" 2>/dev/null || true)
    [ -n "$kib" ] && echo "$(($(date +%s) - t0)) $kib" >>"$RSS"
    sleep "$RSS_EVERY"
  done
) &
SAMPLER=$!

if [ -n "$ITERATIONS" ]; then RUN="ITERATIONS=$ITERATIONS"; else RUN="DURATION=$DURATION"; fi
echo "== soak: $RUN, $VUS VUs, against $BASE (out: $OUT_DIR)"
START=$(date -u +%FT%TZ)
K6_RC=0
k6 run --quiet --address 127.0.0.1:0 -e BROOK_URL="ws://127.0.0.1:$PORT/v1/ws" -e VUS="$VUS" \
  -e ITERATIONS="${ITERATIONS:-0}" -e DURATION="${DURATION:-60s}" \
  -e SUMMARY_JSON="$OUT_DIR/summary.json" loadtest/soak_ws.js || K6_RC=$?
END=$(date -u +%FT%TZ)

FAIL=0
fail() { echo "FAIL: $*"; FAIL=1; }
[ "$K6_RC" -eq 0 ] || fail "k6 exited with $K6_RC (a threshold failed: see above)"

# Aborted requests leave the engine within a step; sockets close as k6 lets go of them.
METRICS=""
value() { echo "$METRICS" | awk -v n="$1" '$1 == n {print $2}'; }
for _ in $(seq 1 150); do
  METRICS=$(curl -fsS "$BASE/metrics")
  if [ "$(value brook:num_requests_running)" = 0 ] && [ "$(value brook:num_requests_waiting)" = 0 ] &&
     [ "$(value brook:kv_cache_blocks_used)" = 0 ] && [ "$(value brook:websocket_connections)" = 0 ]; then
    break
  fi
  sleep 0.2
done
echo "$METRICS" >"$OUT_DIR/metrics.txt"
for m in num_requests_running num_requests_waiting kv_cache_blocks_used websocket_connections websocket_unread_bytes; do
  v=$(value "brook:$m")
  echo "brook:$m $v"
  [ "$v" = 0 ] || fail "brook:$m is $v after the run, want 0"
done
echo "$METRICS" | grep -E '^brook:(request_success_total|request_errors_total|websocket_closes_total|engine_step_failures_total|websocket_slow_consumers_total|kv_cache_blocks_total|prefix_cache_(hits|queries)_total|generation_tokens_total|prompt_tokens_total)' || true
# Errors the malformed messages cause are expected; any other code is a failed request.
BAD=$(echo "$METRICS" | awk '/^brook:request_errors_total\{/ && $2 > 0 && !/code="(invalid_json|invalid_request|unknown_id)"/')
[ -z "$BAD" ] || fail "unexpected error codes: $BAD"
BADCLOSE=$(echo "$METRICS" | awk '/^brook:websocket_closes_total\{/ && $2 > 0 && !/reason="(client|binary_message)"/')
[ -z "$BADCLOSE" ] || fail "unexpected close reasons: $BADCLOSE"

# RSS flat after the warm-up.
read -r N MIN MAX FIRST LAST < <(awk -v w="$WARMUP_PCT" '{ kib[NR] = $2 } END {
  skip = int(NR * w / 100); min = ""; max = 0
  for (i = skip + 1; i <= NR; i++) { if (min == "" || kib[i] < min) min = kib[i]; if (kib[i] > max) max = kib[i] }
  printf "%d %d %d %d %d\n", NR, min, max, kib[1], kib[NR] }' "$RSS")
SPREAD=$(awk -v a="$MIN" -v b="$MAX" 'BEGIN { printf "%.1f", (a > 0) ? (b - a) * 100 / a : 0 }')
echo "RSS: $N samples every ${RSS_EVERY} s; first $((FIRST / 1024)) MiB, after warm-up min $((MIN / 1024)) MiB max $((MAX / 1024)) MiB (spread ${SPREAD} %), last $((LAST / 1024)) MiB"
[ "$N" -ge 5 ] || fail "only $N RSS samples"
awk -v s="$SPREAD" -v t="$RSS_TOLERANCE_PCT" 'BEGIN { exit !(s <= t) }' || fail "RSS spread ${SPREAD} % > ${RSS_TOLERANCE_PCT} %"

echo "== soak $START .. $END: $(tr -d '\n ' <"$OUT_DIR/summary.json" 2>/dev/null || echo 'no summary')"
if [ "$FAIL" -ne 0 ]; then
  echo "soak FAILED (server log: $LOG)"
  exit 1
fi
echo "soak passed"
