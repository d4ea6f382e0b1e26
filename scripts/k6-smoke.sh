#!/usr/bin/env bash
# Starts `brook serve` (the bundled demo model, CPU) on a free port, waits for /health, runs the
# k6 chat smoke, the long-prompt run (~10 KB messages, which k6 sends as continuation frames)
# and the OpenAI API's SSE streams (loadtest/chat_sse.js), then checks /metrics shows nothing
# left running and no KV blocks in use.
# Usage: scripts/k6-smoke.sh [VUS] [DURATION] [LONG_VUS] [LONG_DURATION] [SSE_VUS] [SSE_DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
VUS=${1:-16}
DURATION=${2:-20s}
LONG_VUS=${3:-4}
LONG_DURATION=${4:-15s}
SSE_VUS=${5:-8}
SSE_DURATION=${6:-10s}
BIN=target/release/brook
LOG=$(mktemp)
"$BIN" serve --device cpu --port 0 >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -f "$LOG"' EXIT

PORT=""
for _ in $(seq 1 600); do
  PORT=$(sed -n 's/.*brook listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$LOG" | head -n1)
  [ -n "$PORT" ] && break
  kill -0 $PID 2>/dev/null || { cat "$LOG"; echo "brook serve exited early"; exit 1; }
  sleep 0.2
done
[ -n "$PORT" ] || { cat "$LOG"; echo "brook serve did not start"; exit 1; }
curl -fsS "http://127.0.0.1:$PORT/health" && echo

k6 run --quiet -e BROOK_URL="ws://127.0.0.1:$PORT/v1/ws" -e VUS="$VUS" -e DURATION="$DURATION" loadtest/chat_ws.js
echo "== k6 long prompts (~10 KB, fragmented by the client; $LONG_VUS VUs, $LONG_DURATION)"
k6 run --quiet -e BROOK_URL="ws://127.0.0.1:$PORT/v1/ws" -e VUS="$LONG_VUS" -e DURATION="$LONG_DURATION" loadtest/long_prompt_ws.js
echo "== k6 OpenAI API streamed over SSE ($SSE_VUS VUs, $SSE_DURATION; every fourth request n=2)"
k6 run --quiet -e BROOK_URL="http://127.0.0.1:$PORT" -e VUS="$SSE_VUS" -e DURATION="$SSE_DURATION" loadtest/chat_sse.js

METRICS=$(curl -fsS "http://127.0.0.1:$PORT/metrics")
echo "$METRICS" | grep -E '^brook:(num_requests_running|num_requests_waiting|kv_cache_blocks_used|request_success_total|generation_tokens_total)' || true
echo "$METRICS" | grep -q '^brook:num_requests_running 0$' || { echo "requests still running after the smoke"; exit 1; }
echo "$METRICS" | grep -q '^brook:kv_cache_blocks_used 0$' || { echo "KV blocks still in use after the smoke"; exit 1; }
echo "k6 smoke passed"
