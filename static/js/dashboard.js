// The dashboard view: live engine state from the server's push stream (`GET
// /v1/dashboard/stream`, Server-Sent Events, one snapshot per second; docs/PROTOCOL.md). The
// page never polls /metrics. Charts (uPlot, vendored) keep the last HISTORY_POINTS snapshots.
"use strict";

const HISTORY_POINTS = 300; // 5 minutes at 1 Hz; the server sends as many in `hello`
const $ = (id) => document.getElementById(id);

// Chart definitions: which ChartPoint fields each plots (see snapshot.rs ChartPoint).
const CHARTS = [
  { id: "chart-tps", title: "Generated tokens/s", series: [["tokens_per_s", "tokens/s", "accent"]] },
  { id: "chart-requests", title: "Requests", series: [["running", "running", "accent"], ["waiting", "waiting", "warn"]], integer: true },
  { id: "chart-ttft", title: "TTFT (ms, window percentiles)", series: [["ttft_p50_ms", "P50", "accent"], ["ttft_p95_ms", "P95", "warn"], ["ttft_p99_ms", "P99", "danger"]] },
  { id: "chart-itl", title: "ITL (ms, window percentiles)", series: [["itl_p50_ms", "P50", "accent"], ["itl_p95_ms", "P95", "warn"], ["itl_p99_ms", "P99", "danger"]] },
  { id: "chart-kv", title: "KV usage, device (%)", series: [["kv_usage", "KV %", "accent", (v) => v * 100]] },
  // The second series has its own scale and right-hand axis.
  { id: "chart-step", title: "Engine step: time (ms, left) and tokens per step (right)", series: [["step_time_ms", "step ms", "accent"], ["tokens_per_step", "tokens/step", "ok"]], secondScale: true },
];

export class Dashboard {
  constructor(store) {
    this.store = store;
    this.source = null;
    this.retry = null;
    this.attempt = 0;
    this.points = [];
    this.charts = new Map();
    this.visible = false;
    this.resizeObserver = new ResizeObserver(() => this.resizeCharts());
    this.resizeObserver.observe($("charts"));
  }

  show() {
    this.visible = true;
    this.connect();
    this.buildCharts();
  }

  hide() {
    // The stream is only needed while the view is shown; `hello` refills the charts on return.
    this.visible = false;
    this.disconnect();
  }

  connect() {
    if (this.source) return;
    clearTimeout(this.retry);
    const key = this.store.settings.api_key;
    const url = "/v1/dashboard/stream" + (key ? `?api_key=${encodeURIComponent(key)}` : "");
    const es = new EventSource(url);
    this.source = es;
    this.setStatus("connecting", "connecting…");
    es.addEventListener("hello", (ev) => {
      this.attempt = 0;
      const h = JSON.parse(ev.data);
      this.setStatus("open", "live");
      this.renderEngine(h.engine, h);
      this.points = h.history.slice(-HISTORY_POINTS);
      if (h.latest) this.renderSnapshot(h.latest);
      this.updateCharts();
    });
    es.addEventListener("snapshot", (ev) => {
      const s = JSON.parse(ev.data);
      this.points.push(s.chart);
      if (this.points.length > HISTORY_POINTS) this.points.splice(0, this.points.length - HISTORY_POINTS);
      this.renderSnapshot(s);
      this.updateCharts();
    });
    es.onerror = () => {
      // EventSource retries by itself after a dropped stream; after a refused one (HTTP
      // error, server down at connect) it gives up, so retry with backoff ourselves.
      if (es.readyState === EventSource.CLOSED) {
        this.source = null;
        const delay = Math.min(10000, 500 * 2 ** this.attempt++);
        this.setStatus("closed", `offline, retrying in ${(delay / 1000).toFixed(1)} s`);
        if (this.visible) this.retry = setTimeout(() => this.connect(), delay);
      } else {
        this.setStatus("connecting", "reconnecting…");
      }
    };
  }

  disconnect() {
    clearTimeout(this.retry);
    if (this.source) this.source.close();
    this.source = null;
  }

  /// A new API key: reconnect with it.
  restart() {
    if (!this.visible) return;
    this.disconnect();
    this.connect();
  }

  setStatus(state, text) {
    const s = $("dash-status");
    s.dataset.state = state;
    s.textContent = text;
  }

  renderEngine(e, h) {
    $("dash-engine").textContent =
      `${e.model} on ${e.device} · context ${e.max_model_len} · ${e.max_num_seqs} seqs × ${e.max_num_batched_tokens} tokens per step · ` +
      `KV ${e.kv_blocks} blocks × ${e.kv_block_size} tokens · snapshots every ${h.interval_s} s, percentiles over ${h.window_s} s`;
  }

  renderSnapshot(s) {
    set("tile-tps", fmt(s.tokens_per_s, 1), `prompt ${fmt(s.prompt_tokens_per_s, 0)} tok/s`);
    set("tile-running", s.requests.running, `waiting ${s.requests.waiting} · ${plural(s.requests.websocket_connections, "socket")}`);
    set("tile-waiting", s.requests.waiting, `${fmt(s.requests.finished_per_s, 1)} done/s · ${fmt(s.requests.errors_per_s, 1)} errors/s`);
    setPct("tile-ttft", s.ttft_ms);
    setPct("tile-itl", s.itl_ms);
    const dev = s.kv_tiers.find((t) => t.name === "device") || s.kv_tiers[0];
    set("tile-kv", dev ? `${fmt(dev.usage * 100, 1)}%` : "–",
      s.kv_tiers.map((t) => `${t.name} ${t.used_blocks}/${t.total_blocks} blocks`).join(" · "));
    $("tile-kv").querySelector(".bar > span").style.width = `${Math.min(100, (dev?.usage ?? 0) * 100)}%`;
    const pc = s.prefix_cache;
    set("tile-prefix", pc.hit_rate == null ? "–" : `${fmt(pc.hit_rate * 100, 1)}%`,
      `${pc.hit_tokens}/${pc.queried_tokens} tokens in window · ${pc.hit_rate_total == null ? "–" : fmt(pc.hit_rate_total * 100, 1) + "%"} since start`);
    const b = s.batch;
    set("tile-batch", b.running_seqs, `${b.tokens_per_step == null ? "–" : fmt(b.tokens_per_step, 1)} tokens/step · ${fmt(b.steps_per_s, 1)} steps/s`);
    set("tile-step", b.step_time_ms ? `${fmt(b.step_time_ms.mean, 1)} ms` : "–",
      b.step_time_ms ? `P50 ${fmt(b.step_time_ms.p50, 1)} · P95 ${fmt(b.step_time_ms.p95, 1)} · P99 ${fmt(b.step_time_ms.p99, 1)}` : "no steps in window");
    const em = s.emergency;
    const emTile = $("tile-emergency");
    emTile.dataset.state = em.active ? "active" : "normal";
    set("tile-emergency", em.active ? "ACTIVE" : "normal",
      `${em.entries} entries · ${em.pauses} pauses (${em.pauses_window} in window) · ${em.pauses_spared} spared`);
    set("tile-preempt", s.preemptions.window, `${s.preemptions.total} since start`);
    const spec = $("tile-spec");
    spec.hidden = s.speculative == null;
    if (s.speculative) {
      set("tile-spec", `${fmt(s.speculative.acceptance_rate * 100, 1)}%`,
        `${fmt(s.speculative.accepted_tokens_per_s, 0)}/${fmt(s.speculative.proposed_tokens_per_s, 0)} accepted/proposed tok/s`);
    }
    renderCounts("merge-table", s.merge_decisions, true);
    renderCounts("overload-table", s.overloaded, false);
    renderCounts("finish-table", s.finish_reasons.concat(s.errors.map((e) => ({ ...e, label: `error: ${e.label}` }))), false);
    $("dash-updated").textContent = `updated ${new Date(s.t_ms).toLocaleTimeString()} · #${s.seq} · ${plural(s.fanout.subscribers, "viewer")}`;
  }

  // ---- charts -----------------------------------------------------------------------------

  buildCharts() {
    if (!window.uPlot || !this.visible) return;
    const box = $("charts");
    for (const c of this.charts.values()) c.plot.destroy();
    this.charts.clear();
    box.replaceChildren();
    const css = getComputedStyle(document.documentElement);
    const color = (name) => css.getPropertyValue(`--${name}`).trim();
    for (const def of CHARTS) {
      const card = document.createElement("div");
      card.className = "chart-card";
      card.id = def.id;
      const h = document.createElement("h3");
      h.textContent = def.title;
      const area = document.createElement("div");
      card.append(h, area);
      box.appendChild(card);
      const axis = { stroke: color("muted"), grid: { stroke: color("grid"), width: 1 }, ticks: { stroke: color("grid"), width: 1 } };
      const opts = {
        width: Math.max(200, area.clientWidth || card.clientWidth - 24),
        height: 160,
        legend: { show: true, live: false },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        axes: [axis, { ...axis, size: 48 }],
        series: [{}, ...def.series.map(([, label, c]) => ({ label, stroke: color(c), width: 2, spanGaps: false, points: { show: false } }))],
      };
      if (def.integer) {
        opts.axes[1].incrs = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];
        opts.scales.y = { range: (u, min, max) => [0, Math.max(1, max)] };
      }
      if (def.secondScale) {
        opts.series[2].scale = "n";
        opts.axes.push({ ...axis, scale: "n", side: 1, size: 40, grid: { show: false } });
      }
      const plot = new window.uPlot(opts, this.dataFor(def), area);
      this.charts.set(def.id, { plot, def, area });
    }
  }

  dataFor(def) {
    const xs = this.points.map((p) => p.t);
    const cols = def.series.map(([field, , , map]) => this.points.map((p) => (p[field] == null ? null : map ? map(p[field]) : p[field])));
    return [xs, ...cols];
  }

  updateCharts() {
    if (!this.visible) return;
    if (!this.charts.size) this.buildCharts();
    for (const c of this.charts.values()) c.plot.setData(this.dataFor(c.def));
  }

  resizeCharts() {
    for (const c of this.charts.values()) {
      const w = c.area.clientWidth;
      if (w > 0 && Math.abs(w - c.plot.width) > 1) c.plot.setSize({ width: w, height: 160 });
    }
  }

  /// Colours come from CSS variables: rebuild the charts when the theme changes.
  themeChanged() {
    if (this.visible) this.buildCharts();
  }
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function fmt(x, digits) {
  return x == null || !Number.isFinite(x) ? "–" : x.toFixed(digits);
}

function set(id, value, sub) {
  const tile = $(id);
  tile.querySelector(".value").textContent = String(value);
  if (sub !== undefined) tile.querySelector(".sub").textContent = sub;
}

function setPct(id, p) {
  if (!p) {
    set(id, "–", "no observations in window");
    return;
  }
  set(id, `${fmt(p.p50, 1)} ms`, `P95 ${fmt(p.p95, 1)} · P99 ${fmt(p.p99, 1)} · n=${p.count}`);
}

function renderCounts(id, rows, showMerged) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren();
  const shown = rows.filter((r) => r.total > 0);
  if (!shown.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = showMerged ? 4 : 3;
    td.className = "muted";
    td.textContent = "none yet";
    tr.appendChild(td);
    body.appendChild(tr);
    return;
  }
  for (const r of shown) {
    const tr = document.createElement("tr");
    const cells = [r.label];
    if (showMerged) cells.push(r.merged == null ? "" : r.merged ? "merged" : "held back");
    cells.push(String(r.window), String(r.total));
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
