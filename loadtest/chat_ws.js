// k6 chat load over brook's WebSocket API.
//   k6 run -e BROOK_URL=ws://127.0.0.1:8080/v1/ws -e VUS=16 -e DURATION=20s loadtest/chat_ws.js
// Each VU opens a socket, sends REQS_PER_SOCKET multiplexed chat requests, records time to first
// token and inter-token latency, and checks that every request ends in `done`. Any error frame,
// missing `done` or socket error fails the run (thresholds below).
import ws from "k6/ws";
import { check } from "k6";
import { QUESTIONS } from "./common.js";
import { Trend, Counter, Rate } from "k6/metrics";

const URL = __ENV.BROOK_URL || "ws://127.0.0.1:8080/v1/ws";
const REQS_PER_SOCKET = parseInt(__ENV.REQS_PER_SOCKET || "2", 10);
const MAX_TOKENS = parseInt(__ENV.MAX_TOKENS || "32", 10);
const REQUEST_TIMEOUT_MS = parseInt(__ENV.REQUEST_TIMEOUT_MS || "60000", 10);

export const options = {
  vus: parseInt(__ENV.VUS || "16", 10),
  duration: __ENV.DURATION || "20s",
  thresholds: {
    brook_request_done: ["rate==1"],
    brook_error_frames: ["count==0"],
    checks: ["rate==1"],
  },
};

const ttft = new Trend("brook_ttft", true);
const itl = new Trend("brook_itl", true);
const done = new Rate("brook_request_done");
const errors = new Counter("brook_error_frames");
const tokens = new Counter("brook_tokens");


export default function () {
  const res = ws.connect(URL, {}, function (socket) {
    const pending = {};
    socket.on("open", function () {
      for (let i = 0; i < REQS_PER_SOCKET; i++) {
        const id = `vu${__VU}-it${__ITER}-r${i}`;
        const q = QUESTIONS[(__VU + __ITER + i) % QUESTIONS.length];
        pending[id] = { sent: Date.now(), first: null, last: null };
        socket.send(JSON.stringify({
          type: "generate",
          id,
          messages: [{ role: "user", content: q }],
          params: { max_tokens: MAX_TOKENS, temperature: 0.7, seed: __VU * 1000 + __ITER },
        }));
      }
      socket.setTimeout(function () {
        for (const id in pending) done.add(false);
        socket.close();
      }, REQUEST_TIMEOUT_MS);
    });
    socket.on("message", function (data) {
      const f = JSON.parse(data);
      const p = pending[f.id];
      if (f.type === "error") {
        errors.add(1);
        console.error(`error frame: ${data}`);
      }
      if (!p) return;
      const now = Date.now();
      if (f.type === "delta") {
        if (p.first === null) {
          p.first = now;
          ttft.add(now - p.sent);
        } else {
          const gap = (now - p.last) / Math.max(1, f.tokens);
          for (let i = 0; i < f.tokens; i++) itl.add(gap);
        }
        p.last = now;
      } else if (f.type === "done" || f.type === "error") {
        const ok = check(f, { "request ends in done": (x) => x.type === "done" && x.usage.completion_tokens > 0 });
        done.add(ok);
        if (f.type === "done") tokens.add(f.usage.completion_tokens);
        delete pending[f.id];
        if (Object.keys(pending).length === 0) socket.close();
      }
    });
    socket.on("error", function (e) {
      errors.add(1);
      console.error(`socket error: ${e.error()}`);
    });
  });
  check(res, { "websocket upgraded (101)": (r) => r && r.status === 101 });
}
