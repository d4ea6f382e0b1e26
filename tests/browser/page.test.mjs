// Browser test of brook's page (static/) in Debian's Chromium, driven by playwright-core, against
// a real `brook serve` with the bundled demo model on the CPU. Run by scripts/browser-test.sh
// (and so by .ci/run). Screenshots go to target-out/browser/ (BROWSER_OUT overrides).
//
// Env: BROOK_BIN (default target/release/brook), CHROMIUM (default /usr/bin/chromium).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { chromium } from "playwright-core";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const BIN = process.env.BROOK_BIN || path.join(ROOT, "target/release/brook");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const OUT = process.env.BROWSER_OUT || path.join(ROOT, "target-out/browser");
const DESKTOP = { viewport: { width: 1280, height: 800 } };
const PHONE = { viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true };

let server; // {proc, port, url}
let browser;

// ---- server ---------------------------------------------------------------------------------

/// Starts `brook serve` on `port` (0: any free one) and resolves once it listens.
function startServer(port = 0) {
  return new Promise((resolve, reject) => {
    const proc = spawn(BIN, ["serve", "--device", "cpu", "--port", String(port)], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let log = "";
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`brook serve did not start within 60 s:\n${log}`));
    }, 60000);
    const onData = (chunk) => {
      log += chunk;
      const m = /brook listening on http:\/\/([^:\s]+):(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        proc.stdout.off("data", onData);
        proc.stderr.off("data", onData);
        proc.stdout.resume();
        proc.stderr.resume();
        resolve({ proc, port: Number(m[2]), url: `http://127.0.0.1:${m[2]}` });
      }
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`brook serve exited (${code}):\n${log}`));
    });
  });
}

function killServer(s) {
  return new Promise((resolve) => {
    if (s.proc.exitCode !== null) return resolve();
    s.proc.once("exit", () => resolve());
    s.proc.kill("SIGKILL"); // a crash, as far as the page can tell
  });
}

before(async () => {
  mkdirSync(OUT, { recursive: true });
  server = await startServer();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    // Root in CI containers: Chromium's sandbox needs user namespaces it may not have.
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
});

after(async () => {
  await browser?.close();
  if (server) await killServer(server);
});

// ---- helpers ------------------------------------------------------------------------------------

/// A fresh context (empty localStorage) and page; `errors` collects page errors and console
/// errors (a CSP violation is one), which each test checks.
async function open(pathname = "/", opts = {}) {
  const { route, ...contextOpts } = opts;
  const context = await browser.newContext({ ...DESKTOP, colorScheme: "light", ...contextOpts });
  const page = await context.newPage();
  page.errors = [];
  page.on("pageerror", (e) => page.errors.push(`pageerror: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error") page.errors.push(`console: ${m.text()}`);
  });
  if (route) await route(page);
  await page.goto(server.url + pathname);
  return page;
}

async function connected(page) {
  await page.waitForSelector("#conn-status[data-state=open]", { timeout: 15000 });
}

async function setSettings(page, values) {
  await page.click("#settings-toggle");
  for (const [name, value] of Object.entries(values)) {
    if (typeof value === "boolean") await page.setChecked(`#set-${name}`, value);
    else await page.fill(`#set-${name}`, String(value));
    await page.dispatchEvent(`#set-${name}`, "change");
  }
  await page.click("#settings-close");
}

async function send(page, text) {
  await page.waitForSelector("#send:not([disabled])");
  await page.fill("#input", text);
  await page.press("#input", "Enter");
}

/// Waits for the last reply to finish and returns {text, stats}.
async function lastReply(page, timeout = 30000) {
  await page.waitForSelector("#messages .msg.assistant:last-child:not(.streaming) .stats", { timeout });
  return page.evaluate(() => {
    const el = [...document.querySelectorAll("#messages .msg.assistant")].pop();
    return { text: el.querySelector(".body").textContent, stats: el.querySelector(".stats").textContent };
  });
}

/// Presses Stop once the last reply has streamed some text, and returns that reply when it has
/// ended. The demo model writes ~1,400 tok/s on the CPU, so a 900-token reply can end before the
/// page (which renders behind the server) shows it streaming, or before the cancel reaches the
/// server: then Regenerate starts another, up to 5 tries.
async function stopReply(page) {
  for (let attempt = 1; ; attempt++) {
    const last = attempt >= 5;
    if (attempt > 1) await page.click("#regenerate");
    try {
      await page.waitForFunction(() => {
        const b = document.querySelector("#messages .msg.assistant.streaming .body");
        return b && b.textContent.length > 10;
      }, null, { timeout: 3000 });
      await page.click("#stop", { timeout: 3000 });
    } catch (e) {
      if (last) throw e;
      await lastReply(page);
      continue;
    }
    const reply = await lastReply(page);
    if (/ · stopped$/.test(reply.stats) || last) return reply;
  }
}

/// Frames the page sent and received on its /v1/ws socket(s).
function recordFrames(page) {
  const frames = { sent: [], received: [] };
  page.on("websocket", (ws) => {
    ws.on("framesent", (f) => frames.sent.push(JSON.parse(f.payload)));
    ws.on("framereceived", (f) => frames.received.push(JSON.parse(f.payload)));
  });
  return frames;
}

async function closeAll(page, allowed = []) {
  const errors = page.errors.filter((e) => !allowed.some((re) => re.test(e)));
  await page.context().close();
  assert.deepEqual(errors, [], "no page errors or console errors");
}

// ---- tests --------------------------------------------------------------------------------------

test("a message streams into the page with per-reply stats", async () => {
  const page = await open("/");
  const frames = recordFrames(page);
  await connected(page);
  // A fixed-length reply (long enough to arrive over many frames).
  await setSettings(page, { max_tokens: 200, ignore_eos: true, temperature: 0 });
  // Record every partial text the reply bubble shows while it streams.
  await page.evaluate(() => {
    window.__partials = new Set();
    new MutationObserver(() => {
      const b = document.querySelector("#messages .msg.assistant.streaming .body");
      if (b && b.textContent) window.__partials.add(b.textContent.length);
    }).observe(document.getElementById("messages"), { subtree: true, childList: true, characterData: true });
  });
  await send(page, "Hi, my order 48213 hasn't arrived yet. Where is it?");
  await page.waitForSelector("#stop:not([disabled])");
  const reply = await lastReply(page);
  assert.ok(reply.text.trim().length > 20, `reply text: ${reply.text}`);
  assert.match(reply.stats, /^TTFT \d+ ms · [\d.]+ tok\/s · 200 tokens · length$/);
  const partials = await page.evaluate(() => window.__partials.size);
  assert.ok(partials >= 3, `the bubble showed ${partials} partial texts; expected it to grow while streaming`);
  const deltas = frames.received.filter((f) => f.type === "delta");
  assert.ok(deltas.length > 10, `${deltas.length} delta frames`);
  const gen = frames.sent.find((f) => f.type === "generate");
  assert.equal(gen.params.max_tokens, 200);
  assert.equal(gen.params.ignore_eos, true);
  assert.equal(gen.messages.at(-1).role, "user");
  // The conversation is kept in localStorage under its first message.
  const stored = await page.evaluate(() => JSON.parse(localStorage.getItem("brook.conversations")));
  assert.equal(stored[0].messages.length, 2);
  assert.equal(stored[0].messages[1].content, reply.text);
  assert.match(await page.textContent("#conv-list li.active"), /my order 48213/);
  await closeAll(page);
});

test("Stop sends cancel and keeps the partial reply", async () => {
  const page = await open("/");
  const frames = recordFrames(page);
  await connected(page);
  await setSettings(page, { max_tokens: 900, ignore_eos: true });
  await send(page, "Tell me everything about my refund.");
  const reply = await stopReply(page);
  const m = /· (\d+) tokens · stopped$/.exec(reply.stats);
  assert.ok(m, `stats: ${reply.stats}`);
  assert.ok(Number(m[1]) < 900, `stopped after ${m[1]} tokens`);
  assert.ok(reply.text.length > 10);
  const cancel = frames.sent.filter((f) => f.type === "cancel").at(-1);
  assert.ok(cancel, "a cancel frame was sent");
  const done = frames.received.filter((f) => f.type === "done").at(-1);
  assert.equal(done.finish_reason, "cancelled");
  assert.equal(done.id, cancel.id);
  assert.ok(await page.isDisabled("#stop"));
  assert.ok(await page.isEnabled("#send"));
  // Regenerate replaces the stopped reply with a new one.
  await setSettings(page, { max_tokens: 12 });
  await page.click("#regenerate");
  const again = await lastReply(page);
  assert.match(again.stats, /12 tokens · length$/);
  assert.equal(await page.locator("#messages .msg.assistant").count(), 1);
  await closeAll(page);
});

test("markup in model output is shown as text and never runs", async () => {
  const page = await open("/");
  await connected(page);
  // The renderer itself, in the page (same CSP and DOM as the chat), on crafted output.
  const r = await page.evaluate(async () => {
    const { renderMarkdown } = await import("/static/js/markdown.js");
    const cases = [
      "<script>window.__pwned = 'script'</script>",
      "<img src=x onerror=\"window.__pwned = 'img'\">",
      "<svg onload=\"window.__pwned = 'svg'\"></svg>",
      "[click me](javascript:window.__pwned='link')",
      "**<b>bold</b>** and `<i>code</i>` and *it*",
      "```html\n<script>window.__pwned = 'fence'</script>\n```",
      "&lt;script&gt; stays as typed",
      "call my_var_name and snake_case_too, not window.__a = 1; window.__b",
      "# Title\n- one\n- two\n\n1. first\n2. [docs](https://example.com/a?b=1)\n\n> quoted",
    ];
    const out = [];
    for (const c of cases) {
      const d = document.createElement("div");
      d.className = "msg assistant";
      d.appendChild(renderMarkdown(c));
      document.getElementById("messages").appendChild(d);
      out.push({
        text: d.textContent,
        tags: [...d.querySelectorAll("*")].map((e) => e.tagName.toLowerCase()),
        hrefs: [...d.querySelectorAll("a")].map((a) => a.getAttribute("href")),
        attrs: [...d.querySelectorAll("*")].flatMap((e) => [...e.attributes].map((a) => a.name)),
      });
    }
    await new Promise((res) => setTimeout(res, 500)); // an onerror/onload would have fired
    return { out, pwned: window.__pwned ?? null };
  });
  assert.equal(r.pwned, null, "no injected code ran");
  const allowedTags = new Set(["p", "br", "strong", "em", "code", "pre", "a", "ul", "ol", "li", "h3", "blockquote", "hr"]);
  for (const o of r.out) {
    for (const t of o.tags) assert.ok(allowedTags.has(t), `unexpected <${t}> in ${o.text}`);
    for (const a of o.attrs) assert.ok(["href", "target", "rel", "data-lang", "start", "class"].includes(a), `attribute ${a}`);
  }
  assert.equal(r.out[0].text, "<script>window.__pwned = 'script'</script>");
  assert.equal(r.out[1].text, "<img src=x onerror=\"window.__pwned = 'img'\">");
  assert.deepEqual(r.out[3].hrefs, [], "javascript: link not made a link");
  assert.ok(r.out[4].tags.includes("strong") && r.out[4].tags.includes("code") && r.out[4].tags.includes("em"));
  assert.match(r.out[4].text, /<b>bold<\/b> and <i>code<\/i>/);
  assert.deepEqual(r.out[5].tags, ["pre", "code"]);
  assert.equal(r.out[6].text, "&lt;script&gt; stays as typed");
  assert.deepEqual(r.out[7].tags, ["p"], "underscores inside words are not emphasis");
  assert.deepEqual(r.out[8].tags, ["h3", "ul", "li", "li", "ol", "li", "li", "a", "blockquote", "p"]);
  assert.deepEqual(r.out[8].hrefs, ["https://example.com/a?b=1"]);
  await closeAll(page);

  // End to end: the real server's stream, with a <script> spliced into its first delta.
  const PAYLOAD = "<script>window.__pwned = 'stream'</script><img src=x onerror=\"window.__pwned = 'img'\">**bold** ";
  const page2 = await open("/", {
    route: (p) =>
      p.routeWebSocket(/\/v1\/ws/, (ws) => {
        const srv = ws.connectToServer();
        let injected = false;
        srv.onMessage((msg) => {
          const f = JSON.parse(msg);
          if (f.type === "delta" && !injected) {
            injected = true;
            f.text = PAYLOAD + f.text;
          }
          ws.send(JSON.stringify(f));
        });
      }),
  });
  await connected(page2);
  await send(page2, "Where is my order?");
  const reply = await lastReply(page2);
  assert.ok(reply.text.startsWith("<script>window.__pwned = 'stream'</script><img src=x"), reply.text);
  const state = await page2.evaluate(() => ({
    pwned: window.__pwned ?? null,
    scripts: document.querySelectorAll("#messages script, #messages img, #messages svg").length,
    strong: document.querySelector("#messages .msg.assistant strong")?.textContent ?? null,
  }));
  assert.deepEqual(state, { pwned: null, scripts: 0, strong: "bold" });
  await closeAll(page2);
});

test("errors are explained: overloaded with its retry time, prompt too long", async () => {
  // A stand-in server on the page's socket, answering each generate with the next scripted reply.
  const replies = [
    (id) => [{ type: "error", id, code: "overloaded", message: "server overloaded: queue_full; retry after 1500 ms", retry_after_ms: 1500 }],
    (id) => [
      { type: "started", id, prompt_tokens: 5 },
      { type: "delta", id, text: "Back in business.", tokens: 4 },
      { type: "done", id, finish_reason: "stop", usage: { prompt_tokens: 5, completion_tokens: 4 }, timing: { queue_ms: 0, ttft_ms: 3, total_ms: 5 } },
    ],
    (id) => [{ type: "error", id, code: "prompt_too_long", message: "prompt has 1500 tokens; the limit is 1023" }],
  ];
  const page = await open("/", {
    route: (p) =>
      p.routeWebSocket(/\/v1\/ws/, (ws) => {
        ws.onMessage((msg) => {
          const f = JSON.parse(msg);
          if (f.type === "generate") for (const r of replies.shift()(f.id)) ws.send(JSON.stringify(r));
        });
      }),
  });
  await connected(page);
  await send(page, "Hello?");
  await page.waitForSelector("#banner:not([hidden])");
  const busy = await page.textContent("#banner");
  assert.match(busy, /The server is busy \(server overloaded: queue_full; retry after 1500 ms\)\. Retry in [12] s\./);
  assert.ok(await page.isDisabled("#banner .banner-action"), "retry waits for retry_after_ms");
  await page.waitForSelector("#banner .banner-action:not([disabled])", { timeout: 4000 });
  assert.match(await page.textContent("#banner"), /You can retry now/);
  // The user's message was kept; Retry sends it again.
  await page.click("#banner .banner-action");
  const ok = await lastReply(page);
  assert.equal(ok.text, "Back in business.");
  assert.ok(await page.isHidden("#banner"));
  await send(page, "x".repeat(50));
  await page.waitForSelector("#banner:not([hidden])");
  assert.match(await page.textContent("#banner"), /too long for the model: prompt has 1500 tokens; the limit is 1023\. Start a new chat/);
  await closeAll(page);
});

test("conversations and the system prompt persist across reloads", async () => {
  const page = await open("/");
  const frames = recordFrames(page);
  await connected(page);
  await setSettings(page, { max_tokens: 8, ignore_eos: true });
  await send(page, "First conversation");
  await lastReply(page);
  await page.click("#new-chat");
  await page.click("#settings-toggle");
  await page.fill("#system-prompt", "You are terse.");
  await page.click("#settings-close");
  await send(page, "Second conversation");
  await lastReply(page);
  const gen = frames.sent.filter((f) => f.type === "generate").at(-1);
  assert.deepEqual(gen.messages[0], { role: "system", content: "You are terse." });
  await page.reload();
  await connected(page);
  const titles = await page.$$eval("#conv-list .conv-open", (els) => els.map((e) => e.textContent));
  assert.deepEqual(titles, ["Second conversation", "First conversation"]);
  assert.equal(await page.inputValue("#system-prompt"), "You are terse.");
  await page.click("#conv-list li:nth-child(2) .conv-open");
  assert.equal(await page.textContent("#messages .msg.user"), "First conversation");
  assert.equal(await page.inputValue("#system-prompt"), "");
  assert.equal(await page.locator("#messages .msg.assistant").count(), 1);
  // Deleting a conversation removes it from storage too.
  await page.click("#conv-list li:nth-child(2) .conv-delete", { force: true });
  const left = await page.evaluate(() => JSON.parse(localStorage.getItem("brook.conversations")).map((c) => c.title));
  assert.deepEqual(left, ["Second conversation"]);
  await closeAll(page);
});

test("an API key from the URL hash is kept and sent as ?api_key= on the socket and the stream", async () => {
  const urls = [];
  const page = await open("/#api_key=s3cr%2Bt", {
    route: (p) => {
      p.on("websocket", (ws) => urls.push(ws.url()));
      p.on("request", (r) => urls.push(r.url()));
    },
  });
  await connected(page);
  assert.equal(await page.evaluate(() => location.hash), "", "the key leaves the address bar");
  assert.equal(await page.inputValue("#set-api_key"), "s3cr+t");
  await page.click("#tab-dashboard");
  await page.waitForSelector("#dash-status[data-state=open]");
  assert.ok(urls.some((u) => /\/v1\/ws\?api_key=s3cr%2Bt$/.test(u)), urls.join("\n"));
  assert.ok(urls.some((u) => /\/v1\/dashboard\/stream\?api_key=s3cr%2Bt$/.test(u)), urls.join("\n"));
  // A key typed in the settings replaces it, and the socket reconnects with it.
  await page.click("#tab-chat");
  const reconnect = page.waitForEvent("websocket");
  await setSettings(page, { api_key: "other" });
  assert.match((await reconnect).url(), /\/v1\/ws\?api_key=other$/);
  await connected(page);
  await closeAll(page);
});

test("the dashboard shows non-zero tokens/s while a request runs", async () => {
  const chat = await open("/");
  await connected(chat);
  await setSettings(chat, { max_tokens: 900, ignore_eos: true });
  const dash = await open("/dashboard");
  await dash.waitForSelector("#dash-status[data-state=open]");
  assert.match(await dash.textContent("#dash-engine"), /demo-chat on cpu/);
  // Keep a request running from the chat page (Regenerate after each reply) until the
  // dashboard shows tokens/s > 0 with a running request in the same snapshot.
  let seen = null;
  const deadline = Date.now() + 30000;
  await send(chat, "Tell me a long story about a parcel.");
  while (!seen && Date.now() < deadline) {
    if (await chat.isEnabled("#regenerate")) await chat.click("#regenerate");
    const tiles = await dash.evaluate(() => ({
      tps: parseFloat(document.querySelector("#tile-tps .value").textContent),
      running: parseInt(document.querySelector("#tile-running .value").textContent, 10),
    }));
    const streaming = await chat.isEnabled("#stop");
    if (tiles.tps > 0 && tiles.running >= 1 && streaming) seen = tiles;
    else await dash.waitForTimeout(100);
  }
  assert.ok(seen, "dashboard showed tokens/s > 0 while the chat reply was streaming");
  // Its charts were drawn from the stream.
  assert.equal(await dash.locator("#charts .uplot").count(), 6);
  await stopReply(chat);
  // The dashboard tab of the chat page (same page, no reload) also goes live.
  await chat.click("#tab-dashboard");
  assert.equal(new URL(chat.url()).pathname, "/dashboard");
  await chat.waitForSelector("#dash-status[data-state=open]");
  await chat.waitForFunction(() => document.querySelector("#tile-tps .value").textContent !== "–");
  await chat.goBack();
  assert.ok(await chat.isVisible("#view-chat"));
  await closeAll(chat);
  await closeAll(dash);
});

test("screenshots: chat and dashboard, light and dark, desktop and phone", async () => {
  for (const scheme of ["light", "dark"]) {
    for (const [device, opts] of [["desktop", DESKTOP], ["phone", PHONE]]) {
      const page = await open("/", { ...opts, colorScheme: scheme });
      await connected(page);
      await send(page, "Hi, my order 48213 hasn't arrived yet. Where is it?");
      await lastReply(page);
      await send(page, "Can I return it for a refund instead?");
      await lastReply(page);
      await page.screenshot({ path: path.join(OUT, `chat-${scheme}-${device}.png`) });
      if (device === "desktop") {
        await page.click("#settings-toggle");
        await page.screenshot({ path: path.join(OUT, `chat-settings-${scheme}-${device}.png`) });
        await page.click("#settings-close");
      } else {
        await page.click("#menu-toggle");
        await page.waitForTimeout(300); // the drawer's slide
        await page.screenshot({ path: path.join(OUT, `chat-drawer-${scheme}-${device}.png`) });
        await page.click("#sidebar-scrim", { position: { x: 370, y: 400 } });
        await page.click("#settings-toggle");
        await page.waitForTimeout(300);
        await page.screenshot({ path: path.join(OUT, `chat-settings-${scheme}-${device}.png`) });
        await page.click("#sidebar-scrim", { position: { x: 20, y: 400 } });
        assert.equal(await page.evaluate(() => document.body.className), "", "the scrim closes the drawers");
      }
      await page.click("#tab-dashboard");
      await page.waitForSelector("#dash-status[data-state=open]");
      await page.waitForSelector("#charts .uplot");
      await page.waitForTimeout(1200);
      await page.screenshot({ path: path.join(OUT, `dashboard-${scheme}-${device}.png`) });
      // The whole dashboard: a taller window of the same width.
      await page.setViewportSize({ width: opts.viewport.width, height: device === "phone" ? 2900 : 1500 });
      await page.waitForTimeout(400);
      await page.screenshot({ path: path.join(OUT, `dashboard-full-${scheme}-${device}.png`) });
      const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
      assert.equal(bg, scheme === "dark" ? "rgb(14, 17, 22)" : "rgb(245, 246, 248)");
      await closeAll(page);
    }
  }
});

test("the theme toggle overrides the system scheme and is remembered", async () => {
  const page = await open("/", { colorScheme: "light" });
  const bg = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  assert.equal(await bg(), "rgb(245, 246, 248)");
  await page.click("#theme-toggle");
  assert.equal(await page.getAttribute("html", "data-theme"), "dark");
  assert.equal(await bg(), "rgb(14, 17, 22)");
  await page.reload();
  assert.equal(await bg(), "rgb(14, 17, 22)");
  await page.click("#theme-toggle");
  assert.equal(await bg(), "rgb(245, 246, 248)");
  await closeAll(page);
});

test("the page reconnects after the server restarts", async () => {
  const page = await open("/");
  await connected(page);
  const dash = await open("/dashboard");
  await dash.waitForSelector("#dash-status[data-state=open]");
  const port = server.port;
  await killServer(server);
  await page.waitForSelector("#conn-status[data-state=closed]");
  assert.match(await page.textContent("#banner"), /Not connected: connection lost; reconnecting in/);
  assert.ok(await page.isDisabled("#send"));
  server = await startServer(port);
  // Backoff is capped at 10 s (±20%).
  await page.waitForSelector("#conn-status[data-state=open]", { timeout: 20000 });
  assert.ok(await page.isHidden("#banner"));
  await setSettings(page, { max_tokens: 8, ignore_eos: true });
  await send(page, "Are you back?");
  assert.match((await lastReply(page)).stats, /8 tokens · length$/);
  await dash.waitForSelector("#dash-status[data-state=open]", { timeout: 20000 });
  // Connection failures while the server was down are expected console errors.
  const expected = [/WebSocket connection to .* failed/, /ERR_CONNECTION_REFUSED/, /ERR_INCOMPLETE_CHUNKED_ENCODING/, /EventSource/];
  await closeAll(page, expected);
  await closeAll(dash, expected);
});
