// k6 chat load over brook's OpenAI-compatible API, streamed as Server-Sent Events.
//   k6 run -e BROOK_URL=http://127.0.0.1:8080 -e VUS=8 -e DURATION=20s loadtest/chat_sse.js
// Each iteration POSTs /v1/chat/completions with "stream": true (every fourth with n = 2) and
// stream_options.include_usage, then checks the event stream as OpenAI clients read it: every
// event a `data:` line of a chat.completion.chunk, the assistant role first, a finish_reason
// per choice, the usage chunk (its total the sum of its parts), then `data: [DONE]`. Stock k6
// reads a response body whole, so time to first token is not observable per
// chunk here: `brook_sse_headers` is the time to the response headers (sent once the request is
// admitted) and `brook_sse_e2e` the whole stream. Any failed check or non-200 fails the run.
import http from "k6/http";
import { check } from "k6";
import { Trend, Counter, Rate } from "k6/metrics";
import { QUESTIONS } from "./common.js";

const URL = (__ENV.BROOK_URL || "http://127.0.0.1:8080") + "/v1/chat/completions";
const MODEL = __ENV.MODEL || "demo-chat";
const MAX_TOKENS = parseInt(__ENV.MAX_TOKENS || "32", 10);

export const options = {
  vus: parseInt(__ENV.VUS || "8", 10),
  duration: __ENV.DURATION || "20s",
  summaryTrendStats: ["avg", "med", "p(95)", "max"],
  thresholds: {
    brook_sse_ok: ["rate==1"],
    checks: ["rate==1"],
    brook_sse_tokens: ["count>0"],
  },
};

const headers = new Trend("brook_sse_headers", true);
const e2e = new Trend("brook_sse_e2e", true);
const chunks = new Trend("brook_sse_chunks");
const ok = new Rate("brook_sse_ok");
const tokens = new Counter("brook_sse_tokens");

/// The stream's events: the JSON of each `data:` line, and whether it ended with [DONE].
function parseSse(body) {
  const events = [];
  let done = false;
  for (const block of body.split("\n\n")) {
    if (block === "") continue;
    if (!block.startsWith("data: ")) return null;
    const data = block.slice(6);
    if (data === "[DONE]") {
      done = true;
      continue;
    }
    if (done) return null; // nothing may follow [DONE]
    events.push(JSON.parse(data));
  }
  return done ? events : null;
}

export default function () {
  const n = __ITER % 4 === 3 ? 2 : 1;
  const q = QUESTIONS[(__VU + __ITER) % QUESTIONS.length];
  const res = http.post(
    URL,
    JSON.stringify({
      model: MODEL,
      messages: [{ role: "user", content: q }],
      max_tokens: MAX_TOKENS,
      temperature: 0.7,
      seed: __VU * 1000 + __ITER,
      n,
      stream: true,
      stream_options: { include_usage: true },
    }),
    { headers: { "Content-Type": "application/json" }, timeout: "120s" },
  );
  headers.add(res.timings.waiting);
  e2e.add(res.timings.duration);
  const events = res.status === 200 ? parseSse(res.body) : null;
  const good = check(res, {
    "status 200, text/event-stream": (r) =>
      r.status === 200 && (r.headers["Content-Type"] || "").startsWith("text/event-stream"),
    "data: events ending in [DONE]": () => events !== null,
    "chunks, then the usage chunk": () => {
      if (events === null || events.length < 2) return false;
      const usage = events[events.length - 1];
      const body = events.slice(0, -1);
      return (
        usage.choices.length === 0 &&
        usage.usage.total_tokens === usage.usage.prompt_tokens + usage.usage.completion_tokens &&
        body.every((e) => e.object === "chat.completion.chunk" && e.usage === null)
      );
    },
    "each choice: role first, one finish_reason": () => {
      if (events === null) return false;
      for (let i = 0; i < n; i++) {
        const mine = events.filter((e) => e.choices.length === 1 && e.choices[0].index === i);
        const finishes = mine.filter((e) => e.choices[0].finish_reason !== null);
        if (mine.length < 2 || mine[0].choices[0].delta.role !== "assistant") return false;
        if (finishes.length !== 1 || finishes[0] !== mine[mine.length - 1]) return false;
        if (!["stop", "length"].includes(finishes[0].choices[0].finish_reason)) return false;
      }
      return true;
    },
  });
  ok.add(good);
  if (events !== null && events.length > 0) {
    chunks.add(events.length);
    tokens.add(events[events.length - 1].usage ? events[events.length - 1].usage.completion_tokens : 0);
  }
}
