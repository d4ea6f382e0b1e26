// Soak test of brook's WebSocket API (issue 17), run by scripts/soak.sh, which also samples the
// server's RSS and checks /metrics afterwards.
//   k6 run -e BROOK_URL=ws://127.0.0.1:8080/v1/ws -e ITERATIONS=10000 -e VUS=24 loadtest/soak_ws.js
//   k6 run -e BROOK_URL=... -e DURATION=60s loadtest/soak_ws.js      (the short CI version)
// One socket per iteration, one request each, a long-tail mix:
//   sizes: short questions; medium notes (~2 KB); LONG_FRAC ~10 KB documents, which k6 sends as
//   a text frame plus continuation frames (the server reassembles them);
//   behaviours: DISCONNECT_FRAC close the socket mid-stream, CANCEL_FRAC cancel after the first
//   delta, SLOW_FRAC read slowly (SLOW_MS per frame), MALFORMED_FRAC send a malformed message
//   first (bad JSON, unknown field, bad parameter, unknown cancel, or a binary frame) and expect
//   its error (or close 1003), then a normal request that must succeed (on the same socket, or a
//   new one after the close); the rest are normal requests. So every iteration sends one valid
//   request: ITERATIONS=10000 is 10,000 requests.
// Every non-malformed request must meet its behaviour's expectation (`soak_ok`, rate 1):
// normal and slow ones end in `done` (length or stop), cancelled ones in `done`/`cancelled`,
// disconnecting ones saw only deltas before they left. Any other error frame fails the run.
import ws from "k6/ws";
import { sleep } from "k6";
import { QUESTIONS, documentOf } from "./common.js";
import { Counter, Rate, Trend } from "k6/metrics";

const URL = __ENV.BROOK_URL || "ws://127.0.0.1:8080/v1/ws";
const ITERATIONS = parseInt(__ENV.ITERATIONS || "0", 10);
const VUS = parseInt(__ENV.VUS || "24", 10);
const LONG_FRAC = parseFloat(__ENV.LONG_FRAC || "0.08");
const MEDIUM_FRAC = parseFloat(__ENV.MEDIUM_FRAC || "0.17");
const DISCONNECT_FRAC = parseFloat(__ENV.DISCONNECT_FRAC || "0.10");
const CANCEL_FRAC = parseFloat(__ENV.CANCEL_FRAC || "0.05");
const SLOW_FRAC = parseFloat(__ENV.SLOW_FRAC || "0.05");
const MALFORMED_FRAC = parseFloat(__ENV.MALFORMED_FRAC || "0.03");
const SLOW_MS = parseInt(__ENV.SLOW_MS || "40", 10);
const DOC_BYTES = parseInt(__ENV.DOC_BYTES || "10240", 10);
const TIMEOUT_MS = parseInt(__ENV.REQUEST_TIMEOUT_MS || "180000", 10);

export const options = {
  scenarios: {
    soak: ITERATIONS > 0
      ? { executor: "shared-iterations", vus: VUS, iterations: ITERATIONS, maxDuration: __ENV.MAX_DURATION || "3h" }
      : { executor: "constant-vus", vus: VUS, duration: __ENV.DURATION || "60s", gracefulStop: "180s" },
  },
  summaryTrendStats: ["avg", "med", "p(95)", "p(99)", "max"],
  thresholds: {
    soak_ok: ["rate==1"],
    soak_unexpected_errors: ["count==0"],
    soak_malformed_answered: ["rate==1"],
  },
};

const ok = new Rate("soak_ok");
const requests = new Counter("soak_requests");
const unexpected = new Counter("soak_unexpected_errors");
const malformedAnswered = new Rate("soak_malformed_answered");
const e2e = new Trend("soak_e2e_ms", true);

function pick(fracs) {
  let r = Math.random();
  for (const [name, f] of fracs) {
    if (r < f) return name;
    r -= f;
  }
  return fracs[fracs.length - 1][0];
}

// Malformed messages and what the server answers: an error frame's code, or a close code.
const MALFORMED = [
  { frame: '{"type":"generate","id":"m","prompt":"unterminated', code: "invalid_json" },
  { frame: '{"type":"generate","id":"m","prompt":"hi","bogus":1}', code: "invalid_request" },
  { frame: '{"type":"generate","id":"m","prompt":"hi","params":{"temperature":-1}}', code: "invalid_request" },
  { frame: '{"type":"cancel","id":"never-sent"}', code: "unknown_id" },
  { frame: '{"type":"shout","id":"m"}', code: "invalid_request" },
  { binary: true, close: 1003 },
];

function generateFrame(id, size, maxTokens, seed, ignoreEos) {
  const q = QUESTIONS[Math.floor(Math.random() * QUESTIONS.length)];
  let content = q;
  if (size === "long") content = `Summarise these notes:\n${documentOf(DOC_BYTES)}`;
  else if (size === "medium") content = `${documentOf(2048)}\n${q}`;
  return JSON.stringify({
    type: "generate",
    id,
    messages: [{ role: "user", content }],
    params: { max_tokens: maxTokens, temperature: 0.8, seed, ignore_eos: ignoreEos },
  });
}

export default function () {
  const behaviour = pick([
    ["disconnect", DISCONNECT_FRAC],
    ["cancel", CANCEL_FRAC],
    ["slow", SLOW_FRAC],
    ["malformed", MALFORMED_FRAC],
    ["normal", 1],
  ]);
  const size = pick([["long", LONG_FRAC], ["medium", MEDIUM_FRAC], ["short", 1]]);
  const bad = behaviour === "malformed" ? MALFORMED[Math.floor(Math.random() * MALFORMED.length)] : null;
  if (bad && bad.binary) {
    // The server closes the socket (1003): the valid request goes on a new one.
    const closed = connect("malformed", size, bad, false);
    malformedAnswered.add(closed.badAnswered, { behaviour, size });
    ok.add(connect("malformed", size, null, true).result === true, { behaviour, size });
    return;
  }
  const r = connect(behaviour, size, bad, true);
  if (bad) malformedAnswered.add(r.badAnswered, { behaviour, size });
  ok.add(r.result === true, { behaviour, size });
}

// One socket: `bad` first when given, then (with `valid`) one request behaving as `behaviour`.
function connect(behaviour, size, bad, valid) {
  const tags = { behaviour, size };
  const id = `vu${__VU}-it${__ITER}${valid ? "" : "-bad"}`;
  const seed = __VU * 1000003 + __ITER;
  // Cancelled and disconnecting requests ignore eos, so they are still running when the client acts.
  const acts = behaviour === "cancel" || behaviour === "disconnect";
  const maxTokens = acts ? 200 : size === "long" ? 16 : 32;
  const leaveAfter = 1 + Math.floor(Math.random() * 4);
  let result = null; // the verdict for the valid request; null until known
  let badAnswered = bad ? false : null;
  let deltas = 0;
  let sent = 0;

  const send = (socket) => {
    sent = Date.now();
    requests.add(1, tags);
    socket.send(generateFrame(id, size, maxTokens, seed, acts));
  };

  ws.connect(URL, {}, function (socket) {
    socket.on("open", function () {
      if (bad && bad.binary) {
        socket.sendBinary(new Uint8Array([1, 2, 3]).buffer);
      } else if (bad) {
        socket.send(bad.frame);
      } else if (valid) {
        send(socket);
      }
      socket.setTimeout(function () {
        if (result === null && valid) {
          console.error(`${id} (${behaviour}, ${size}): no answer within ${TIMEOUT_MS} ms`);
          result = false;
        }
        socket.close();
      }, TIMEOUT_MS);
    });
    socket.on("message", function (data) {
      const f = JSON.parse(data);
      if (bad && !badAnswered && f.type === "error" && f.code === bad.code) {
        badAnswered = true;
        if (valid) send(socket);
        return;
      }
      if (f.type === "error") {
        unexpected.add(1, tags);
        console.error(`${id} (${behaviour}, ${size}): unexpected error frame ${data}`);
        result = false;
        socket.close();
        return;
      }
      if (f.id !== id) return;
      if (behaviour === "slow") sleep(SLOW_MS / 1000);
      if (f.type === "delta") {
        deltas += 1;
        if (behaviour === "cancel" && deltas === 1) socket.send(JSON.stringify({ type: "cancel", id }));
        if (behaviour === "disconnect" && deltas === leaveAfter) {
          result = true;
          socket.close();
        }
      } else if (f.type === "done") {
        const want = behaviour === "cancel" ? ["cancelled"] : ["length", "stop"];
        // A disconnecting request that ended before its client left is fine too.
        result = want.includes(f.finish_reason) || behaviour === "disconnect";
        if (!result) console.error(`${id} (${behaviour}, ${size}): ${data}`);
        e2e.add(Date.now() - sent, tags);
        socket.close();
      }
    });
    socket.on("close", function (code) {
      if (bad && bad.binary && !badAnswered) {
        badAnswered = code === bad.close;
        if (!badAnswered) console.error(`${id}: binary frame closed with ${code}, want ${bad.close}`);
      }
    });
    socket.on("error", function (e) {
      if (result === null && !(bad && bad.binary)) {
        console.error(`${id} (${behaviour}, ${size}): socket error ${e.error()}`);
        unexpected.add(1, tags);
        result = false;
      }
    });
  });
  return { result, badAnswered };
}

export function handleSummary(data) {
  const m = data.metrics;
  const v = (name) => (m[name] ? m[name].values : {});
  const out = {
    iterations: v("iterations").count,
    requests: v("soak_requests").count,
    ok_rate: v("soak_ok").rate,
    ok_passes: v("soak_ok").passes,
    ok_fails: v("soak_ok").fails,
    malformed: (v("soak_malformed_answered").passes || 0) + (v("soak_malformed_answered").fails || 0),
    malformed_answered_rate: v("soak_malformed_answered").rate,
    unexpected_errors: v("soak_unexpected_errors").count || 0,
    e2e_ms: v("soak_e2e_ms"),
    duration_s: data.state.testRunDurationMs / 1000,
  };
  const text = JSON.stringify(out, null, 2);
  const res = { stdout: text + "\n" };
  if (__ENV.SUMMARY_JSON) res[__ENV.SUMMARY_JSON] = text;
  return res;
}
