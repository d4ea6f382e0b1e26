// Long-tail chat load against brook, for comparing scheduling policies on the real engine.
//   k6 run -e BROOK_URL=ws://127.0.0.1:8080/v1/ws -e RATE=4 -e DURATION=60s loadtest/longtail_ws.js
// Open-loop Poisson-like arrivals (constant-arrival-rate, one request per socket) of three
// classes: LONG_FRAC of requests carry a long document (LONG_WORDS_MIN..MAX words), MEDIUM_FRAC a
// medium one (MEDIUM_WORDS_MIN..MAX; 0 by default), the rest are short customer questions. A
// request meets its SLO only if it ends in `done`, its TTFT is within its class's TTFT SLO, its
// mean inter-token latency within the ITL SLO and (when SHORT_E2E_MS is set, short requests only)
// its end-to-end time within that. Errors (overloaded included) count as missed, and so do
// arrivals k6 dropped (no VU free: the server fell behind) and requests still open when k6 stopped
// (GRACEFUL_STOP after the run): `requests` counts every arrival, `slo_met` is the share of them
// that met their SLO. Per class, the shares are of the requests started in that class (a dropped
// arrival never drew one). The summary prints it all; SUMMARY_JSON writes it to a file.
// With WORKLOAD_SEED set, arrival i of the run draws its class, question and document from a
// generator seeded by (WORKLOAD_SEED, i) instead of Math.random: two runs at one rate and seed
// get the same requests at the same times whatever the server does, so a policy A/B compares
// like with like (unseeded, one 60 s run drew 45 long documents and its pair 29).
import ws from "k6/ws";
import exec from "k6/execution";
import { check } from "k6";
import { QUESTIONS } from "./common.js";
import { Trend, Rate, Counter } from "k6/metrics";

const URL = __ENV.BROOK_URL || "ws://127.0.0.1:8080/v1/ws";
const RATE = parseFloat(__ENV.RATE || "4");
const num = (name, dflt) => parseFloat(__ENV[name] || dflt);
const int = (name, dflt) => parseInt(__ENV[name] || dflt, 10);
const LONG_FRAC = num("LONG_FRAC", "0.1");
const MEDIUM_FRAC = num("MEDIUM_FRAC", "0");
const WORDS = {
  medium: [int("MEDIUM_WORDS_MIN", "150"), int("MEDIUM_WORDS_MAX", "300")],
  long: [int("LONG_WORDS_MIN", "600"), int("LONG_WORDS_MAX", "1400")],
};
const MAX_TOKENS = {
  short: int("SHORT_MAX_TOKENS", "48"),
  medium: int("MEDIUM_MAX_TOKENS", "64"),
  long: int("LONG_MAX_TOKENS", "64"),
};
// UNIQUE_DOCS=1 opens each document with its own case number: documents share no prefix beyond the
// instruction, so each one's prefill is computed in full (with the default 0 every document is a
// prefix of the same text and the prefix cache serves most of it).
const UNIQUE_DOCS = __ENV.UNIQUE_DOCS === "1";
// A request still open after this many seconds is closed (and missed).
const TIMEOUT_MS = num("TIMEOUT_S", "120") * 1000;
// SLOs in ms, scaled to the hardware (defaults: the CPU demo model on 2 cores).
const SLO = {
  short: { ttft: num("SHORT_TTFT_MS", "500"), itl: num("SHORT_ITL_MS", "150"), e2e: num("SHORT_E2E_MS", "Infinity") },
  medium: { ttft: num("MEDIUM_TTFT_MS", "2000"), itl: num("MEDIUM_ITL_MS", "150"), e2e: Infinity },
  long: { ttft: num("LONG_TTFT_MS", "8000"), itl: num("LONG_ITL_MS", "150"), e2e: Infinity },
};
const CLASSES = ["short", "medium", "long"];

// k6 computes per-class sub-metrics only for metrics named in thresholds; these always pass.
const thresholds = {};
for (const c of CLASSES) {
  thresholds[`brook_slo_met{class:${c}}`] = ["rate>=0"];
  thresholds[`brook_started{class:${c}}`] = ["count>=0"];
  thresholds[`brook_ttft{class:${c}}`] = ["p(99)>=0"];
  thresholds[`brook_e2e{class:${c}}`] = ["p(99)>=0"];
  thresholds[`brook_prompt_tokens{class:${c}}`] = ["max>=0"];
}

export const options = {
  scenarios: {
    longtail: {
      executor: "constant-arrival-rate",
      rate: Math.round(RATE * 100),
      timeUnit: "100s",
      duration: __ENV.DURATION || "60s",
      preAllocatedVUs: int("VUS", "64"),
      maxVUs: int("MAX_VUS", "256"),
      gracefulStop: __ENV.GRACEFUL_STOP || "30s",
    },
  },
  summaryTrendStats: ["avg", "min", "med", "p(95)", "p(99)", "max"],
  thresholds,
};

const ttft = new Trend("brook_ttft", true);
const itl = new Trend("brook_itl", true);
const e2e = new Trend("brook_e2e", true);
const promptTokens = new Trend("brook_prompt_tokens");
const met = new Rate("brook_slo_met");
const done = new Rate("brook_request_done");
const started = new Counter("brook_started");
const tokens = new Counter("brook_tokens");

const DOC_WORDS = ("Order 58231 was placed on March 3 and shipped from the Lyon warehouse. The customer " +
  "reported that the parcel arrived with a damaged corner and the blender inside did not start. " +
  "Our policy allows a refund or a replacement within thirty days of delivery when the item is " +
  "defective, provided the original packaging is kept. The agent offered a prepaid return label " +
  "and asked for a photo of the damage. ").split(" ");

const WORKLOAD_SEED = __ENV.WORKLOAD_SEED === undefined || __ENV.WORKLOAD_SEED === ""
  ? null : int("WORKLOAD_SEED", "0");

// mulberry32 over a state mixed from (seed, arrival index): uniform in [0, 1).
function seededRandom(seed, index) {
  let a = (Math.imul(index + 1, 0x9e3779b1) ^ Math.imul(seed + 1, 0x85ebca77)) >>> 0;
  return function () {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function documentOf(words, random) {
  const out = UNIQUE_DOCS ? [`Case ${Math.floor(random() * 1e9)}.`] : [];
  for (let i = 0; i < words; i++) out.push(DOC_WORDS[i % DOC_WORDS.length]);
  return out.join(" ");
}

function drawClass(random) {
  const u = random();
  if (u < LONG_FRAC) return "long";
  if (u < LONG_FRAC + MEDIUM_FRAC) return "medium";
  return "short";
}

export default function () {
  const random = WORKLOAD_SEED === null
    ? Math.random
    : seededRandom(WORKLOAD_SEED, exec.scenario.iterationInTest);
  const cls = drawClass(random);
  const tags = { class: cls };
  // Counted before anything can fail or be interrupted: a request that never reports below
  // is a miss, not absent.
  started.add(1, tags);
  const q = QUESTIONS[Math.floor(random() * QUESTIONS.length)];
  let content = q;
  if (cls !== "short") {
    const [lo, hi] = WORDS[cls];
    const words = lo + Math.floor(random() * Math.max(1, hi - lo));
    content = `Summarise this case and tell me what to do next:\n${documentOf(words, random)}\n${q}`;
  }
  const frame = JSON.stringify({
    type: "generate",
    id: "r",
    messages: [{ role: "user", content }],
    params: { max_tokens: MAX_TOKENS[cls], temperature: 0.7, ignore_eos: true },
  });
  let sent = 0, first = null, last = null, ok = false, n = 0;
  ws.connect(URL, {}, function (socket) {
    socket.on("open", function () {
      sent = Date.now();
      socket.send(frame);
      socket.setTimeout(function () { socket.close(); }, TIMEOUT_MS);
    });
    socket.on("message", function (data) {
      const f = JSON.parse(data);
      const now = Date.now();
      if (f.type === "started") {
        promptTokens.add(f.prompt_tokens, tags);
      } else if (f.type === "delta") {
        if (first === null) { first = now; ttft.add(now - sent, tags); }
        else { const g = (now - last) / Math.max(1, f.tokens); for (let i = 0; i < f.tokens; i++) itl.add(g, tags); }
        last = now;
      } else if (f.type === "done" || f.type === "error") {
        ok = f.type === "done";
        if (ok) {
          n = f.usage.completion_tokens;
          e2e.add(now - sent, tags);
        }
        socket.close();
      }
    });
  });
  done.add(ok, tags);
  if (ok) tokens.add(n, tags);
  const meanItl = ok && n > 1 && first !== null ? (last - first) / (n - 1) : 0;
  const slo = SLO[cls];
  const good = ok && first !== null && first - sent <= slo.ttft && meanItl <= slo.itl && last - sent <= slo.e2e;
  met.add(good, tags);
  check(ok, { "request ends in done": (x) => x });
}

// Attainment with every arrival counted: met / (started + dropped).
function attainment(metCount, startedCount, droppedCount) {
  const total = startedCount + droppedCount;
  return total > 0 ? metCount / total : null;
}

export function handleSummary(data) {
  const m = data.metrics;
  const pick = (name) => (m[name] ? m[name].values : {});
  const count = (name) => pick(name).count || 0;
  const passes = (name) => pick(name).passes || 0;
  const dropped = count("dropped_iterations");
  const startedAll = count("brook_started");
  const out = {
    rate: RATE,
    duration: __ENV.DURATION || "60s",
    unique_docs: UNIQUE_DOCS,
    workload_seed: WORKLOAD_SEED,
    slo: SLO,
    shares: { short: 1 - LONG_FRAC - MEDIUM_FRAC, medium: MEDIUM_FRAC, long: LONG_FRAC },
    // Every arrival: started (ended or not) plus dropped by k6.
    requests: startedAll + dropped,
    started: startedAll,
    dropped,
    // Started but never reported (still open when k6 stopped).
    interrupted: startedAll - (passes("brook_request_done") + (pick("brook_request_done").fails || 0)),
    met: passes("brook_slo_met"),
    slo_met: attainment(passes("brook_slo_met"), startedAll, dropped),
    done: startedAll + dropped > 0 ? passes("brook_request_done") / (startedAll + dropped) : null,
    tokens_per_s: pick("brook_tokens").rate,
    output_tokens: count("brook_tokens"),
    itl: pick("brook_itl"),
  };
  for (const c of CLASSES) {
    const s = count(`brook_started{class:${c}}`);
    out[`started_${c}`] = s;
    out[`slo_met_${c}`] = s > 0 ? passes(`brook_slo_met{class:${c}}`) / s : null;
    out[`ttft_${c}`] = pick(`brook_ttft{class:${c}}`);
    out[`e2e_${c}`] = pick(`brook_e2e{class:${c}}`);
    out[`prompt_tokens_${c}`] = pick(`brook_prompt_tokens{class:${c}}`);
  }
  const text = JSON.stringify(out, null, 2);
  const res = { stdout: text + "\n" };
  if (__ENV.SUMMARY_JSON) res[__ENV.SUMMARY_JSON] = text;
  return res;
}
