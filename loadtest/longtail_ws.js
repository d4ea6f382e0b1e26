// Long-tail chat load against brook, for comparing scheduling policies on the real engine.
//   k6 run -e BROOK_URL=ws://127.0.0.1:8080/v1/ws -e RATE=4 -e DURATION=60s loadtest/longtail_ws.js
// Open-loop Poisson-like arrivals (constant-arrival-rate, one request per socket): LONG_FRAC of
// requests carry a long document (LONG_TOKENS_MIN..MAX prompt tokens, roughly), the rest are short
// customer questions. A request meets its SLO only if it ends in `done`, its TTFT is within its
// class's TTFT SLO and its mean inter-token latency within the ITL SLO; errors (overloaded
// included) count as missed. The summary prints attainment overall and per class; SUMMARY_JSON
// writes it to a file.
import ws from "k6/ws";
import { check } from "k6";
import { QUESTIONS } from "./common.js";
import { Trend, Rate, Counter } from "k6/metrics";

const URL = __ENV.BROOK_URL || "ws://127.0.0.1:8080/v1/ws";
const RATE = parseFloat(__ENV.RATE || "4");
const LONG_FRAC = parseFloat(__ENV.LONG_FRAC || "0.1");
const LONG_WORDS_MIN = parseInt(__ENV.LONG_WORDS_MIN || "600", 10);
const LONG_WORDS_MAX = parseInt(__ENV.LONG_WORDS_MAX || "1400", 10);
const SHORT_MAX_TOKENS = parseInt(__ENV.SHORT_MAX_TOKENS || "48", 10);
const LONG_MAX_TOKENS = parseInt(__ENV.LONG_MAX_TOKENS || "64", 10);
// UNIQUE_DOCS=1 opens each document with its own case number: documents share no prefix beyond the
// instruction, so each one's prefill is computed in full (with the default 0 every document is a
// prefix of the same text and the prefix cache serves most of it).
const UNIQUE_DOCS = __ENV.UNIQUE_DOCS === "1";
// SLOs in ms, scaled to the hardware (defaults: the CPU demo model on 2 cores).
const SLO = {
  short: { ttft: parseFloat(__ENV.SHORT_TTFT_MS || "500"), itl: parseFloat(__ENV.SHORT_ITL_MS || "150") },
  long: { ttft: parseFloat(__ENV.LONG_TTFT_MS || "8000"), itl: parseFloat(__ENV.LONG_ITL_MS || "150") },
};

export const options = {
  scenarios: {
    longtail: {
      executor: "constant-arrival-rate",
      rate: Math.round(RATE * 100),
      timeUnit: "100s",
      duration: __ENV.DURATION || "60s",
      preAllocatedVUs: parseInt(__ENV.VUS || "64", 10),
      maxVUs: parseInt(__ENV.MAX_VUS || "256", 10),
    },
  },
  summaryTrendStats: ["avg", "med", "p(95)", "p(99)", "max"],
  // k6 computes per-class sub-metrics only for metrics named in thresholds; these always pass.
  thresholds: {
    "brook_slo_met{class:short}": ["rate>=0"],
    "brook_slo_met{class:long}": ["rate>=0"],
    "brook_ttft{class:short}": ["p(99)>=0"],
    "brook_ttft{class:long}": ["p(99)>=0"],
  },
};

const ttft = new Trend("brook_ttft", true);
const itl = new Trend("brook_itl", true);
const met = new Rate("brook_slo_met");
const done = new Rate("brook_request_done");
const tokens = new Counter("brook_tokens");

const DOC_WORDS = ("Order 58231 was placed on March 3 and shipped from the Lyon warehouse. The customer " +
  "reported that the parcel arrived with a damaged corner and the blender inside did not start. " +
  "Our policy allows a refund or a replacement within thirty days of delivery when the item is " +
  "defective, provided the original packaging is kept. The agent offered a prepaid return label " +
  "and asked for a photo of the damage. ").split(" ");

function documentOf(words) {
  const out = UNIQUE_DOCS ? [`Case ${Math.floor(Math.random() * 1e9)}.`] : [];
  for (let i = 0; i < words; i++) out.push(DOC_WORDS[i % DOC_WORDS.length]);
  return out.join(" ");
}

export default function () {
  const long = Math.random() < LONG_FRAC;
  const cls = long ? "long" : "short";
  const q = QUESTIONS[Math.floor(Math.random() * QUESTIONS.length)];
  const content = long
    ? `Summarise this case and tell me what to do next:\n${documentOf(LONG_WORDS_MIN + Math.floor(Math.random() * (LONG_WORDS_MAX - LONG_WORDS_MIN)))}\n${q}`
    : q;
  const frame = JSON.stringify({
    type: "generate",
    id: "r",
    messages: [{ role: "user", content }],
    params: { max_tokens: long ? LONG_MAX_TOKENS : SHORT_MAX_TOKENS, temperature: 0.7, ignore_eos: true },
  });
  const tags = { class: cls };
  let sent = 0, first = null, last = null, ok = false, n = 0;
  ws.connect(URL, {}, function (socket) {
    socket.on("open", function () {
      sent = Date.now();
      socket.send(frame);
      socket.setTimeout(function () { socket.close(); }, 120000);
    });
    socket.on("message", function (data) {
      const f = JSON.parse(data);
      const now = Date.now();
      if (f.type === "delta") {
        if (first === null) { first = now; ttft.add(now - sent, tags); }
        else { const g = (now - last) / Math.max(1, f.tokens); for (let i = 0; i < f.tokens; i++) itl.add(g, tags); }
        last = now;
      } else if (f.type === "done" || f.type === "error") {
        ok = f.type === "done";
        if (ok) n = f.usage.completion_tokens;
        socket.close();
      }
    });
  });
  done.add(ok, tags);
  if (ok) tokens.add(n, tags);
  const meanItl = ok && n > 1 && first !== null ? (last - first) / (n - 1) : 0;
  const good = ok && first !== null && first - sent <= SLO[cls].ttft && meanItl <= SLO[cls].itl;
  met.add(good, tags);
  check(ok, { "request ends in done": (x) => x });
}

export function handleSummary(data) {
  const m = data.metrics;
  const pick = (name) => (m[name] ? m[name].values : {});
  const out = {
    rate: RATE,
    unique_docs: UNIQUE_DOCS,
    slo: SLO,
    slo_met: pick("brook_slo_met").rate,
    slo_met_short: pick("brook_slo_met{class:short}").rate,
    slo_met_long: pick("brook_slo_met{class:long}").rate,
    done: pick("brook_request_done").rate,
    ttft_short: pick("brook_ttft{class:short}"),
    ttft_long: pick("brook_ttft{class:long}"),
    itl: pick("brook_itl"),
    tokens_per_s: pick("brook_tokens").rate,
    requests: pick("brook_request_done").passes + pick("brook_request_done").fails,
  };
  const text = JSON.stringify(out, null, 2);
  const res = { stdout: text + "\n" };
  if (__ENV.SUMMARY_JSON) res[__ENV.SUMMARY_JSON] = text;
  return res;
}
