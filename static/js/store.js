// Conversations and settings, kept in localStorage. Nothing here touches the DOM.
//
// Storage layout (one key each, JSON):
//   brook.conversations  [{id, title, system, messages: [{role, content, stats?}], updated}]
//   brook.current        id of the open conversation
//   brook.settings       sampling params + api key (see DEFAULT_SETTINGS)
//   brook.theme          "light" | "dark" (absent: follow the system)
"use strict";

const K_CONVS = "brook.conversations";
const K_CURRENT = "brook.current";
const K_SETTINGS = "brook.settings";
const K_THEME = "brook.theme";

export const DEFAULT_SETTINGS = Object.freeze({
  temperature: 0.7,
  top_p: 1.0,
  top_k: 0,
  max_tokens: 256,
  seed: "",          // empty: random
  stop: "",          // one stop string per line; \n and \t escapes allowed
  ignore_eos: false,
  api_key: "",
});

function read(key, fallback) {
  try {
    const raw = localStorage.getItem(key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback; // corrupt or unavailable storage: start fresh rather than break the page
  }
}

function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false; // quota exceeded or storage disabled: the page still works for this visit
  }
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

export class Store {
  constructor() {
    const convs = read(K_CONVS, []);
    this.conversations = Array.isArray(convs) ? convs.filter(isConversation) : [];
    this.currentId = read(K_CURRENT, null);
    this.settings = { ...DEFAULT_SETTINGS, ...read(K_SETTINGS, {}) };
    if (!this.current()) this.currentId = this.conversations[0]?.id ?? this.create().id;
  }

  current() {
    return this.conversations.find((c) => c.id === this.currentId) || null;
  }

  get(id) {
    return this.conversations.find((c) => c.id === id) || null;
  }

  create() {
    const conv = { id: newId(), title: "New chat", system: "", messages: [], updated: Date.now() };
    this.conversations.unshift(conv);
    this.currentId = conv.id;
    this.save();
    return conv;
  }

  select(id) {
    if (this.get(id)) {
      this.currentId = id;
      write(K_CURRENT, id);
    }
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.conversations[0]?.id ?? null;
    if (!this.currentId) this.create();
    this.save();
  }

  /// Marks a conversation changed (title from its first user message) and saves everything.
  touch(conv) {
    const first = conv.messages.find((m) => m.role === "user");
    if (first) conv.title = first.content.replace(/\s+/g, " ").trim().slice(0, 48) || "New chat";
    conv.updated = Date.now();
    this.save();
  }

  save() {
    write(K_CONVS, this.conversations);
    write(K_CURRENT, this.currentId);
  }

  saveSettings(patch) {
    this.settings = { ...this.settings, ...patch };
    write(K_SETTINGS, this.settings);
  }

  static theme() {
    return read(K_THEME, null);
  }

  static setTheme(theme) {
    if (theme) write(K_THEME, theme);
    else localStorage.removeItem(K_THEME);
  }
}

function isConversation(c) {
  return c && typeof c.id === "string" && Array.isArray(c.messages);
}

/// Sampling params for a generate frame from the settings; throws Error with a message naming
/// the field when one is out of range (the server would refuse it anyway, but later).
export function samplingParams(s) {
  const num = (name, v, lo, hi) => {
    const x = Number(v);
    if (!Number.isFinite(x) || x < lo || x > hi) throw new Error(`${name} must be between ${lo} and ${hi}`);
    return x;
  };
  const int = (name, v, lo, hi) => {
    const x = num(name, v, lo, hi);
    if (!Number.isInteger(x)) throw new Error(`${name} must be a whole number`);
    return x;
  };
  const p = {
    temperature: num("temperature", s.temperature, 0, 100),
    top_p: num("top-p", s.top_p, 0, 1),
    top_k: int("top-k", s.top_k, 0, 1 << 30),
    max_tokens: int("max tokens", s.max_tokens, 1, 1048576),
  };
  if (p.top_p === 0) throw new Error("top-p must be above 0");
  if (String(s.seed).trim() !== "") p.seed = int("seed", String(s.seed).trim(), 0, Number.MAX_SAFE_INTEGER);
  const stops = String(s.stop || "")
    .split("\n")
    .filter((x) => x.length > 0)
    .map((x) => x.replace(/\\n/g, "\n").replace(/\\t/g, "\t"));
  if (stops.length > 16) throw new Error("at most 16 stop strings");
  if (stops.length) p.stop = stops;
  if (s.ignore_eos) p.ignore_eos = true;
  return p;
}
