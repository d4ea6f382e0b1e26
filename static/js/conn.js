// The chat's WebSocket to /v1/ws: connects, reconnects with capped exponential backoff (with
// jitter, so many pages do not reconnect in step after a server restart), and reports its state.
// Protocol: docs/PROTOCOL.md. An API key, when set, goes in the `api_key` query parameter
// (browsers cannot set headers on a WebSocket).
"use strict";

const BACKOFF_START_MS = 500;
const BACKOFF_MAX_MS = 10000;

// Close codes with a message of their own (RFC 6455 and docs/PROTOCOL.md).
const CLOSE_REASONS = {
  1008: "refused by the server's policy (API key or origin?)",
  1009: "message too big for the server",
  1011: "server error",
  1013: "server busy, try again later",
};

export function wsUrl(apiKey) {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const q = apiKey ? `?api_key=${encodeURIComponent(apiKey)}` : "";
  return `${proto}//${location.host}/v1/ws${q}`;
}

export class Connection {
  /// onFrame(frame) for each server frame; onState(state, detail) with state one of
  /// "connecting" | "open" | "closed"; onClose(code, reason) when an open socket closes.
  constructor({ apiKey, onFrame, onState, onClose }) {
    this.apiKey = apiKey || "";
    this.onFrame = onFrame;
    this.onState = onState;
    this.onClose = onClose || (() => {});
    this.ws = null;
    this.attempt = 0;
    this.timer = null;
    this.connect();
  }

  get open() {
    return !!this.ws && this.ws.readyState === WebSocket.OPEN;
  }

  setApiKey(key) {
    if (key === this.apiKey) return;
    this.apiKey = key;
    this.reconnectNow();
  }

  reconnectNow() {
    clearTimeout(this.timer);
    this.attempt = 0;
    if (this.ws) {
      const old = this.ws;
      this.ws = null;
      old.onclose = null;
      old.close();
    }
    this.connect();
  }

  connect() {
    this.timer = null;
    this.onState("connecting", this.attempt ? `retry ${this.attempt}` : "");
    let ws;
    try {
      ws = new WebSocket(wsUrl(this.apiKey));
    } catch (e) {
      this.scheduleRetry(`cannot connect: ${e.message}`);
      return;
    }
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.attempt = 0;
      this.onState("open", "");
    };
    ws.onmessage = (ev) => {
      let frame;
      try {
        frame = JSON.parse(ev.data);
      } catch {
        return; // the protocol only sends JSON; ignore anything else rather than break
      }
      this.onFrame(frame);
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      const why = CLOSE_REASONS[ev.code] || (opened ? "connection lost" : "server unreachable");
      if (opened) this.onClose(ev.code, why);
      this.scheduleRetry(why);
    };
  }

  scheduleRetry(why) {
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_START_MS * 2 ** this.attempt);
    const delay = Math.round(base * (0.8 + 0.4 * Math.random()));
    this.attempt += 1;
    this.onState("closed", `${why}; reconnecting in ${(delay / 1000).toFixed(1)} s`);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  /// Sends a frame; false when the socket is not open (the caller says so to the user).
  send(frame) {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }
}
