// k6 long prompts over brook's WebSocket API: each request carries a ~10 KB document.
//   k6 run -e BROOK_URL=ws://127.0.0.1:8080/v1/ws -e VUS=4 -e DURATION=20s loadtest/long_prompt_ws.js
// k6's WebSocket client (gorilla/websocket) sends a message larger than its 4 KB write buffer as
// a text frame followed by continuation frames, as browsers and other clients may: this is the
// RFC 6455 fragmentation the server must reassemble (issue 17). Every request must end in `done`;
// any error frame or socket error fails the run.
//
// The bundled demo model has a 1024-token context, so the documents are made of words its
// tokenizer holds whole (one token each, ~11 bytes): DOC_BYTES=10240 is ~900 tokens. For a
// model with a longer context any text will do.
import ws from "k6/ws";
import { check } from "k6";
import { Trend, Counter, Rate } from "k6/metrics";
import { documentOf } from "./common.js";

const URL = __ENV.BROOK_URL || "ws://127.0.0.1:8080/v1/ws";
const DOC_BYTES = parseInt(__ENV.DOC_BYTES || "10240", 10);
const MAX_TOKENS = parseInt(__ENV.MAX_TOKENS || "16", 10);
const REQUEST_TIMEOUT_MS = parseInt(__ENV.REQUEST_TIMEOUT_MS || "60000", 10);

export const options = {
  vus: parseInt(__ENV.VUS || "4", 10),
  duration: __ENV.DURATION || "20s",
  summaryTrendStats: ["avg", "med", "p(95)", "max"],
  thresholds: {
    brook_request_done: ["rate==1"],
    brook_error_frames: ["count==0"],
    brook_long_requests: ["count>0"],
    checks: ["rate==1"],
  },
};

const ttft = new Trend("brook_ttft", true);
const e2e = new Trend("brook_e2e", true);
const frameBytes = new Trend("brook_message_bytes");
const promptTokens = new Trend("brook_prompt_tokens");
const done = new Rate("brook_request_done");
const errors = new Counter("brook_error_frames");
const longRequests = new Counter("brook_long_requests");

export default function () {
  const id = `vu${__VU}-it${__ITER}`;
  const frame = JSON.stringify({
    type: "generate",
    id,
    messages: [{ role: "user", content: `Summarise these notes:\n${documentOf(DOC_BYTES)}` }],
    params: { max_tokens: MAX_TOKENS, temperature: 0.7, seed: __VU * 1000 + __ITER },
  });
  const res = ws.connect(URL, {}, function (socket) {
    let sent = 0;
    let finished = false;
    socket.on("open", function () {
      sent = Date.now();
      frameBytes.add(frame.length);
      socket.send(frame);
      socket.setTimeout(function () {
        if (!finished) done.add(false);
        socket.close();
      }, REQUEST_TIMEOUT_MS);
    });
    socket.on("message", function (data) {
      const f = JSON.parse(data);
      if (f.type === "error") {
        errors.add(1);
        console.error(`error frame: ${data}`);
      }
      if (f.id !== id) return;
      if (f.type === "started") {
        promptTokens.add(f.prompt_tokens);
      } else if (f.type === "done" || f.type === "error") {
        finished = true;
        const ok = check(f, {
          "long prompt ends in done": (x) => x.type === "done" && x.usage.completion_tokens > 0,
        });
        done.add(ok);
        if (f.type === "done") {
          longRequests.add(1);
          ttft.add(f.timing.ttft_ms); // measured in the engine (arrival to first token)
          e2e.add(Date.now() - sent);
        }
        socket.close();
      }
    });
    socket.on("error", function (e) {
      errors.add(1);
      console.error(`socket error: ${e.error()}`);
    });
  });
  check(res, { "websocket upgraded (101)": (r) => r && r.status === 101 });
}
