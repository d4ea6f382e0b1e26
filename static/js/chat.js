// The chat view: conversations (sidebar), messages, composer, settings, and one reply in flight.
// Frames are docs/PROTOCOL.md's; the connection (with reconnect) is conn.js's.
"use strict";

import { Connection } from "./conn.js";
import { renderInto } from "./markdown.js";
import { DEFAULT_SETTINGS, samplingParams } from "./store.js";

const $ = (id) => document.getElementById(id);

export class Chat {
  constructor(store) {
    this.store = store;
    this.pending = null; // the reply in flight: {id, conv, text, tokens, sentAt, firstAt, node, raf}
    this.nextId = 1;
    this.retryTimer = null;
    this.els = {
      list: $("conv-list"),
      messages: $("messages"),
      input: $("input"),
      send: $("send"),
      stop: $("stop"),
      regen: $("regenerate"),
      banner: $("banner"),
      status: $("conn-status"),
      system: $("system-prompt"),
    };
    this.bindSettings();
    this.bindComposer();
    this.conn = new Connection({
      apiKey: store.settings.api_key,
      onFrame: (f) => this.onFrame(f),
      onState: (state, detail) => this.onConnState(state, detail),
      onClose: (code, why) => this.onConnLost(why),
    });
    this.renderSidebar();
    this.renderConversation();
  }

  // ---- connection -------------------------------------------------------------------------

  onConnState(state, detail) {
    const s = this.els.status;
    s.dataset.state = state;
    s.textContent = state === "open" ? "connected" : state === "connecting" ? "connecting…" : "offline";
    s.title = detail || "";
    if (state === "closed") this.showBanner(`Not connected: ${detail}.`, "warn");
    else if (state === "open" && this.els.banner.dataset.kind === "warn") this.hideBanner();
    this.updateButtons();
  }

  onConnLost(why) {
    if (!this.pending) return;
    // The server dropped the request with the socket; keep what arrived.
    this.finishPending({ finish: "connection lost", error: `Connection lost (${why}); the partial reply is kept. Press Regenerate to try again.` });
  }

  // ---- frames -----------------------------------------------------------------------------

  onFrame(f) {
    const p = this.pending;
    if (!p || f.id !== p.id) {
      if (f.type === "error" && f.id == null) this.showBanner(`Server: ${f.code}: ${f.message}`, "error");
      return;
    }
    if (f.type === "started") {
      p.promptTokens = f.prompt_tokens;
    } else if (f.type === "delta") {
      if (p.firstAt === null) p.firstAt = performance.now();
      p.text += f.text;
      p.tokens += f.tokens;
      this.scheduleRender();
    } else if (f.type === "done") {
      const n = f.usage.completion_tokens;
      // The engine's decode rate, from its own timing: deltas can arrive batched in one
      // event-loop turn, which would make a client-side rate meaningless for short replies.
      const genSecs = f.timing?.ttft_ms != null ? (f.timing.total_ms - f.timing.ttft_ms) / 1000 : 0;
      this.finishPending({
        finish: f.finish_reason,
        stats: {
          ttft_ms: p.firstAt === null ? null : p.firstAt - p.sentAt,
          server_ttft_ms: f.timing?.ttft_ms ?? null,
          tokens: n,
          prompt_tokens: f.usage.prompt_tokens,
          tps: genSecs > 0 && n > 1 ? (n - 1) / genSecs : null,
          finish_reason: f.finish_reason,
        },
      });
    } else if (f.type === "error") {
      this.finishPending({ finish: "error", error: describeError(f), retryAfterMs: f.retry_after_ms });
    }
  }

  // ---- sending ----------------------------------------------------------------------------

  send(text) {
    if (this.pending) return;
    const conv = this.store.current();
    if (text) {
      conv.messages.push({ role: "user", content: text });
      this.store.touch(conv);
      this.renderSidebar();
    }
    this.generate(conv);
  }

  /// Sends the conversation as it stands (its last message is the user's).
  generate(conv) {
    this.hideBanner();
    let params;
    try {
      params = samplingParams(this.store.settings);
    } catch (e) {
      this.showBanner(`Settings: ${e.message}.`, "error");
      this.renderConversation();
      return;
    }
    const messages = [];
    if (conv.system.trim()) messages.push({ role: "system", content: conv.system });
    for (const m of conv.messages) messages.push({ role: m.role, content: m.content });
    const id = `c${this.nextId++}`;
    if (!this.conn.send({ type: "generate", id, messages, params })) {
      this.showBanner("Not connected to the server; the message will need to be sent again once it reconnects (Regenerate).", "error");
      this.renderConversation();
      return;
    }
    this.renderConversation();
    const node = this.appendBubble({ role: "assistant", content: "" }, true);
    this.pending = { id, conv, text: "", tokens: 0, sentAt: performance.now(), firstAt: null, node, raf: 0 };
    this.updateButtons();
  }

  stop() {
    if (this.pending) this.conn.send({ type: "cancel", id: this.pending.id });
  }

  regenerate() {
    if (this.pending) return;
    const conv = this.store.current();
    while (conv.messages.length && conv.messages[conv.messages.length - 1].role === "assistant") conv.messages.pop();
    if (!conv.messages.length) return;
    this.store.touch(conv);
    this.generate(conv);
  }

  finishPending({ finish, stats, error, retryAfterMs }) {
    const p = this.pending;
    if (!p) return;
    cancelAnimationFrame(p.raf);
    this.pending = null;
    if (p.text || !error) {
      p.conv.messages.push({ role: "assistant", content: p.text, stats: stats || { finish_reason: finish } });
      this.store.touch(p.conv);
    }
    if (p.conv === this.store.current()) this.renderConversation();
    if (error) this.showError(error, retryAfterMs);
    this.updateButtons();
  }

  showError(message, retryAfterMs) {
    clearInterval(this.retryTimer);
    if (!retryAfterMs) {
      this.showBanner(message, "error", "Retry");
      return;
    }
    // Overloaded: say when, and offer the retry only then.
    const until = Date.now() + retryAfterMs;
    const tick = () => {
      const left = Math.max(0, until - Date.now());
      if (left === 0) {
        clearInterval(this.retryTimer);
        this.showBanner(`${message} You can retry now.`, "error", "Retry");
      } else {
        this.showBanner(`${message} Retry in ${Math.ceil(left / 1000)} s.`, "error", "Retry", true);
      }
    };
    tick();
    this.retryTimer = setInterval(tick, 250);
  }

  // ---- rendering --------------------------------------------------------------------------

  scheduleRender() {
    const p = this.pending;
    if (p.raf) return;
    // One render per frame however many deltas arrived: the whole reply is re-rendered.
    p.raf = requestAnimationFrame(() => {
      p.raf = 0;
      if (p.conv !== this.store.current()) return;
      renderInto(p.node.querySelector(".body"), p.text);
      this.scrollToEnd();
    });
  }

  renderSidebar() {
    const list = this.els.list;
    list.replaceChildren();
    for (const c of this.store.conversations) {
      const li = document.createElement("li");
      li.className = c.id === this.store.currentId ? "active" : "";
      const open = document.createElement("button");
      open.className = "conv-open";
      open.textContent = c.title || "New chat";
      open.title = c.title || "New chat";
      open.onclick = () => {
        this.store.select(c.id);
        this.renderSidebar();
        this.renderConversation();
        document.body.classList.remove("sidebar-open");
      };
      const del = document.createElement("button");
      del.className = "conv-delete icon-btn";
      del.textContent = "×";
      del.title = "Delete this conversation";
      del.setAttribute("aria-label", `Delete ${c.title}`);
      del.onclick = () => {
        if (this.pending && this.pending.conv === c) return;
        this.store.remove(c.id);
        this.renderSidebar();
        this.renderConversation();
      };
      li.append(open, del);
      list.appendChild(li);
    }
  }

  renderConversation() {
    const conv = this.store.current();
    this.els.system.value = conv.system;
    const box = this.els.messages;
    box.replaceChildren();
    if (!conv.messages.length && !(this.pending && this.pending.conv === conv)) {
      const empty = document.createElement("div");
      empty.className = "empty";
      empty.textContent = "Ask about an order, a return or a refund. Replies stream from brook token by token.";
      box.appendChild(empty);
    }
    for (const m of conv.messages) this.appendBubble(m, false);
    if (this.pending && this.pending.conv === conv) {
      this.pending.node = this.appendBubble({ role: "assistant", content: this.pending.text }, true);
    }
    this.scrollToEnd();
    this.updateButtons();
  }

  appendBubble(m, streaming) {
    const div = document.createElement("div");
    div.className = `msg ${m.role === "user" ? "user" : "assistant"}${streaming ? " streaming" : ""}`;
    const body = document.createElement("div");
    body.className = "body";
    if (m.role === "user") body.textContent = m.content; // the user's own text, shown as typed
    else renderInto(body, m.content);
    div.appendChild(body);
    if (m.role !== "user") {
      const stats = document.createElement("div");
      stats.className = "stats";
      stats.textContent = streaming ? "generating…" : formatStats(m.stats);
      div.appendChild(stats);
    }
    const empty = this.els.messages.querySelector(".empty");
    if (empty) empty.remove();
    this.els.messages.appendChild(div);
    return div;
  }

  scrollToEnd() {
    const box = this.els.messages;
    box.scrollTop = box.scrollHeight;
  }

  updateButtons() {
    const busy = !!this.pending;
    const conv = this.store.current();
    this.els.send.disabled = busy || !this.conn?.open;
    this.els.stop.disabled = !busy;
    this.els.regen.disabled = busy || !this.conn?.open || !conv.messages.length;
  }

  showBanner(text, kind, action, actionDisabled) {
    const b = this.els.banner;
    b.hidden = false;
    b.dataset.kind = kind;
    b.replaceChildren(document.createTextNode(text));
    if (action) {
      const btn = document.createElement("button");
      btn.textContent = action;
      btn.className = "banner-action";
      btn.disabled = !!actionDisabled;
      btn.onclick = () => {
        clearInterval(this.retryTimer);
        this.regenerate();
      };
      b.appendChild(btn);
    }
  }

  hideBanner() {
    clearInterval(this.retryTimer);
    this.els.banner.hidden = true;
    this.els.banner.dataset.kind = "";
    this.els.banner.replaceChildren();
  }

  // ---- controls ---------------------------------------------------------------------------

  bindComposer() {
    const { input } = this.els;
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = input.value.trim();
      if (!text || this.pending || !this.conn.open) return;
      input.value = "";
      this.send(text);
    });
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    this.els.stop.onclick = () => this.stop();
    this.els.regen.onclick = () => this.regenerate();
    $("new-chat").onclick = () => {
      this.store.create();
      this.renderSidebar();
      this.renderConversation();
      document.body.classList.remove("sidebar-open");
      input.focus();
    };
  }

  bindSettings() {
    const s = this.store.settings;
    const fields = ["temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "api_key"];
    for (const name of fields) {
      const input = $(`set-${name}`);
      input.value = s[name];
      input.addEventListener("change", () => {
        this.store.saveSettings({ [name]: input.value });
        if (name === "api_key") this.conn.setApiKey(input.value.trim());
      });
    }
    const eos = $("set-ignore_eos");
    eos.checked = !!s.ignore_eos;
    eos.addEventListener("change", () => this.store.saveSettings({ ignore_eos: eos.checked }));
    this.els.system.addEventListener("input", () => {
      const conv = this.store.current();
      conv.system = this.els.system.value;
      this.store.save();
    });
    $("settings-reset").onclick = () => {
      this.store.saveSettings({ ...DEFAULT_SETTINGS, api_key: this.store.settings.api_key });
      for (const name of fields) $(`set-${name}`).value = this.store.settings[name];
      eos.checked = !!this.store.settings.ignore_eos;
    };
  }
}

/// What the user sees for an error frame (codes in docs/PROTOCOL.md).
export function describeError(f) {
  switch (f.code) {
    case "overloaded":
      return `The server is busy (${f.message}).`;
    case "rate_limited":
      return `Too many requests on this connection (${f.message}).`;
    case "prompt_too_long":
      return `This conversation is too long for the model: ${f.message}. Start a new chat, or shorten the system prompt or earlier messages.`;
    case "invalid_request":
      return `The server refused the request: ${f.message}. Check the settings.`;
    case "internal":
      return `The server failed on this request: ${f.message}.`;
    default:
      return `${f.code}: ${f.message}`;
  }
}

export function formatStats(st) {
  if (!st) return "";
  const parts = [];
  if (st.ttft_ms != null) parts.push(`TTFT ${Math.round(st.ttft_ms)} ms`);
  if (st.tps != null) parts.push(`${st.tps.toFixed(1)} tok/s`);
  if (st.tokens != null) parts.push(`${st.tokens} tokens`);
  if (st.finish_reason) parts.push(st.finish_reason === "cancelled" ? "stopped" : st.finish_reason);
  return parts.join(" · ");
}
