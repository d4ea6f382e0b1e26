//! The dashboard's payload, computed from a bounded window of cumulative metric snapshots
//! (pure: the caller supplies the clock, so tests drive it with made-up times).
//!
//! Rates (tokens/s, steps/s, requests/s) cover the last interval (~1 s). Percentiles (TTFT, ITL,
//! step time) and the prefix-cache hit rate cover the whole window (`WINDOW_S`): they come from
//! **histogram bucket deltas** between the newest snapshot and the oldest one in the window,
//! interpolated inside a bucket as Prometheus' `histogram_quantile` does — so their resolution
//! is the bucket layout's (src/metrics.rs), and nothing per request is kept.

use std::collections::VecDeque;

use serde::Serialize;

use crate::metrics::{HistogramSnapshot, MetricsSnapshot};
use crate::scheduler::MergeReason;

/// Seconds of history the percentiles and window counts cover.
pub const WINDOW_S: f64 = 60.0;

/// Cumulative snapshots, oldest first, covering at least `WINDOW_S` once warmed up; bounded.
#[derive(Debug, Default)]
pub struct Window {
    samples: VecDeque<(f64, MetricsSnapshot)>,
}

impl Window {
    /// Adds the snapshot taken at `t` (seconds, any origin, non-decreasing) and drops the ones
    /// no longer needed: the oldest kept is the newest at least `WINDOW_S` old.
    pub fn push(&mut self, t: f64, snap: MetricsSnapshot) {
        self.samples.push_back((t, snap));
        while self.samples.len() > 2 && t - self.samples[1].0 >= WINDOW_S {
            self.samples.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    fn newest(&self) -> Option<&(f64, MetricsSnapshot)> {
        self.samples.back()
    }

    /// The snapshot before the newest (the last interval's start), or the newest alone.
    fn previous(&self) -> Option<&(f64, MetricsSnapshot)> {
        let n = self.samples.len();
        self.samples.get(n.saturating_sub(2))
    }

    fn oldest(&self) -> Option<&(f64, MetricsSnapshot)> {
        self.samples.front()
    }
}

/// Percentiles of one latency, in milliseconds, over the window.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub mean: f64,
    /// Observations in the window.
    pub count: u64,
}

impl Percentiles {
    /// `None` when the window holds no observation.
    fn of_ms(h: &HistogramSnapshot) -> Option<Self> {
        let ms = |s: f64| s * 1e3;
        Some(Percentiles {
            p50: ms(h.quantile(0.50)?),
            p95: ms(h.quantile(0.95)?),
            p99: ms(h.quantile(0.99)?),
            mean: ms(h.mean()?),
            count: h.count,
        })
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Requests {
    pub running: i64,
    pub waiting: i64,
    pub finished_per_s: f64,
    pub errors_per_s: f64,
    pub websocket_connections: i64,
}

/// One KV memory tier: `device` (the executor's pool, GPU or CPU memory), then `host` when a
/// host tier is configured (its used blocks: those held by swapped-out requests).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KvTier {
    pub name: &'static str,
    pub used_blocks: i64,
    pub total_blocks: i64,
    /// used / total, 0 to 1.
    pub usage: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PrefixCache {
    /// Prompt tokens found in the cache / looked up, over the window; null without lookups.
    pub hit_rate: Option<f64>,
    pub queried_tokens: u64,
    pub hit_tokens: u64,
    /// Since start.
    pub hit_rate_total: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Batch {
    /// Sequences in the running batch now (each gets a slot in every step).
    pub running_seqs: i64,
    pub steps_per_s: f64,
    /// Tokens per engine step over the last interval; null without steps (or while emergency
    /// mode suspends that metric).
    pub tokens_per_step: Option<f64>,
    /// Executor time per step over the window.
    pub step_time_ms: Option<Percentiles>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Emergency {
    pub active: bool,
    pub entries: u64,
    pub exits: u64,
    /// Long sequences paused (preempted) on entering emergency mode: since start, in the window.
    pub pauses: u64,
    pub pauses_window: u64,
    /// Sequences the pause spared because it alone would break their own SLO.
    pub pauses_spared: u64,
}

/// A labelled counter: since start and over the window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LabelCount {
    pub label: String,
    pub total: u64,
    pub window: u64,
    /// For batch-merge reasons: whether this reason merged the candidate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merged: Option<bool>,
}

/// Speculative decoding's acceptance. No engine path reports it yet, so the snapshot's field
/// is null; the page shows the panel as soon as it is filled.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Speculative {
    pub acceptance_rate: f64,
    pub proposed_tokens_per_s: f64,
    pub accepted_tokens_per_s: f64,
}

/// What one chart point needs; the page appends `chart` of each snapshot, and a new subscriber
/// gets the recent ones at once.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChartPoint {
    /// Unix time, seconds.
    pub t: f64,
    pub tokens_per_s: f64,
    pub running: i64,
    pub waiting: i64,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p95_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    /// Device-tier KV usage, 0 to 1.
    pub kv_usage: f64,
    pub step_time_ms: Option<f64>,
    pub tokens_per_step: Option<f64>,
}

/// Fan-out state, filled in by the producer.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Fanout {
    pub subscribers: usize,
    /// Snapshots skipped by slow subscribers since start.
    pub dropped: u64,
}

/// One push to the dashboard.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DashboardSnapshot {
    pub seq: u64,
    /// Unix time, milliseconds.
    pub t_ms: u64,
    /// Length of the last interval (the rates' denominator), seconds.
    pub interval_s: f64,
    /// Span the percentiles and window counts cover, seconds (less than `WINDOW_S` just after
    /// start).
    pub window_s: f64,
    /// How the percentiles are computed.
    pub percentiles_from: &'static str,
    pub tokens_per_s: f64,
    pub prompt_tokens_per_s: f64,
    pub requests: Requests,
    pub ttft_ms: Option<Percentiles>,
    pub itl_ms: Option<Percentiles>,
    pub e2e_ms: Option<Percentiles>,
    pub kv_tiers: Vec<KvTier>,
    pub prefix_cache: PrefixCache,
    pub batch: Batch,
    pub preemptions: LabelCount,
    pub emergency: Emergency,
    pub merge_decisions: Vec<LabelCount>,
    pub overloaded: Vec<LabelCount>,
    pub finish_reasons: Vec<LabelCount>,
    pub errors: Vec<LabelCount>,
    /// Null until speculative decoding reports acceptance.
    pub speculative: Option<Speculative>,
    pub fanout: Fanout,
    pub chart: ChartPoint,
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

fn per_s(later: u64, earlier: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        later.saturating_sub(earlier) as f64 / secs
    } else {
        0.0
    }
}

fn sum(v: &[(String, u64)]) -> u64 {
    v.iter().map(|(_, n)| n).sum()
}

/// Totals and window deltas of a counter vector (labels absent from the older snapshot count
/// from zero).
fn label_counts(now: &[(String, u64)], old: &[(String, u64)]) -> Vec<LabelCount> {
    now.iter()
        .map(|(label, total)| {
            let before = old.iter().find(|(l, _)| l == label).map_or(0, |(_, n)| *n);
            LabelCount {
                label: label.clone(),
                total: *total,
                window: total.saturating_sub(before),
                merged: None,
            }
        })
        .collect()
}

/// Computes the payload from the window. `None` before the first snapshot.
pub fn compute(w: &Window, seq: u64, t_ms: u64, fanout: Fanout) -> Option<DashboardSnapshot> {
    let (t_now, now) = w.newest()?;
    let (t_prev, prev) = w.previous()?;
    let (t_old, old) = w.oldest()?;
    let interval_s = t_now - t_prev;
    let window_s = t_now - t_old;

    let step_window = now.step_time.since(&old.step_time);
    let step_tokens_last = now.step_tokens.since(&prev.step_tokens);
    let ttft_ms = Percentiles::of_ms(&now.ttft.since(&old.ttft));
    let itl_ms = Percentiles::of_ms(&now.itl.since(&old.itl));
    let step_time_ms = Percentiles::of_ms(&step_window);
    let kv_usage = ratio(
        now.kv_blocks_used.max(0) as u64,
        now.kv_blocks_total.max(0) as u64,
    )
    .unwrap_or(0.0);
    let tokens_per_s = per_s(now.generation_tokens, prev.generation_tokens, interval_s);
    let tokens_per_step = step_tokens_last.mean();

    let mut merge_decisions = label_counts(&now.merge_decisions, &old.merge_decisions);
    for m in &mut merge_decisions {
        m.merged = MergeReason::ALL
            .iter()
            .find(|r| r.as_str() == m.label)
            .map(|r| r.merged());
    }
    let queried = now
        .prefix_cache_queries
        .saturating_sub(old.prefix_cache_queries);
    let hits = now.prefix_cache_hits.saturating_sub(old.prefix_cache_hits);

    Some(DashboardSnapshot {
        seq,
        t_ms,
        interval_s,
        window_s,
        percentiles_from: "histogram_bucket_deltas",
        tokens_per_s,
        prompt_tokens_per_s: per_s(now.prompt_tokens, prev.prompt_tokens, interval_s),
        requests: Requests {
            running: now.requests_running,
            waiting: now.requests_waiting,
            finished_per_s: per_s(
                sum(&now.requests_finished),
                sum(&prev.requests_finished),
                interval_s,
            ),
            errors_per_s: per_s(
                sum(&now.request_errors),
                sum(&prev.request_errors),
                interval_s,
            ),
            websocket_connections: now.ws_connections,
        },
        ttft_ms,
        itl_ms,
        e2e_ms: Percentiles::of_ms(&now.e2e_latency.since(&old.e2e_latency)),
        kv_tiers: std::iter::once(KvTier {
            name: "device",
            used_blocks: now.kv_blocks_used,
            total_blocks: now.kv_blocks_total,
            usage: kv_usage,
        })
        .chain((now.kv_host_blocks_total > 0).then(|| {
            KvTier {
                name: "host",
                used_blocks: now.kv_host_blocks_used,
                total_blocks: now.kv_host_blocks_total,
                usage: ratio(
                    now.kv_host_blocks_used.max(0) as u64,
                    now.kv_host_blocks_total as u64,
                )
                .unwrap_or(0.0),
            }
        }))
        .collect(),
        prefix_cache: PrefixCache {
            hit_rate: ratio(hits, queried),
            queried_tokens: queried,
            hit_tokens: hits,
            hit_rate_total: ratio(now.prefix_cache_hits, now.prefix_cache_queries),
        },
        batch: Batch {
            running_seqs: now.requests_running,
            steps_per_s: per_s(now.step_time.count, prev.step_time.count, interval_s),
            tokens_per_step,
            step_time_ms,
        },
        preemptions: LabelCount {
            label: "preemptions".into(),
            total: now.preemptions,
            window: now.preemptions.saturating_sub(old.preemptions),
            merged: None,
        },
        emergency: Emergency {
            active: now.emergency_mode,
            entries: now.emergency_entries,
            exits: now.emergency_exits,
            pauses: now.emergency_pauses,
            pauses_window: now.emergency_pauses.saturating_sub(old.emergency_pauses),
            pauses_spared: now.emergency_pauses_spared,
        },
        merge_decisions,
        overloaded: label_counts(&now.overloaded, &old.overloaded),
        finish_reasons: label_counts(&now.requests_finished, &old.requests_finished),
        errors: label_counts(&now.request_errors, &old.request_errors),
        speculative: (now.spec_draft_tokens > 0).then(|| Speculative {
            // Over the window when it proposed anything, else since start.
            acceptance_rate: ratio(
                now.spec_accepted_tokens
                    .saturating_sub(old.spec_accepted_tokens),
                now.spec_draft_tokens.saturating_sub(old.spec_draft_tokens),
            )
            .or_else(|| ratio(now.spec_accepted_tokens, now.spec_draft_tokens))
            .unwrap_or(0.0),
            proposed_tokens_per_s: per_s(now.spec_draft_tokens, prev.spec_draft_tokens, interval_s),
            accepted_tokens_per_s: per_s(
                now.spec_accepted_tokens,
                prev.spec_accepted_tokens,
                interval_s,
            ),
        }),
        fanout,
        chart: ChartPoint {
            t: t_ms as f64 / 1e3,
            tokens_per_s,
            running: now.requests_running,
            waiting: now.requests_waiting,
            ttft_p50_ms: ttft_ms.map(|p| p.p50),
            ttft_p95_ms: ttft_ms.map(|p| p.p95),
            ttft_p99_ms: ttft_ms.map(|p| p.p99),
            itl_p50_ms: itl_ms.map(|p| p.p50),
            itl_p95_ms: itl_ms.map(|p| p.p95),
            itl_p99_ms: itl_ms.map(|p| p.p99),
            kv_usage,
            step_time_ms: step_time_ms.map(|p| p.mean),
            tokens_per_step,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn rates_cover_the_last_interval_and_percentiles_the_window() {
        let m = Metrics::new();
        let mut w = Window::default();
        m.kv_blocks_total.set(200);
        // Slow first tokens early on; they leave the window later.
        for _ in 0..50 {
            m.ttft.observe(2.0);
        }
        w.push(0.0, m.snapshot());
        m.generation_tokens.inc_by(100);
        w.push(1.0, m.snapshot());
        m.generation_tokens.inc_by(250);
        m.kv_blocks_used.set(50);
        m.requests_running.set(3);
        w.push(2.0, m.snapshot());
        let s = compute(&w, 7, 2_000, Fanout::default()).unwrap();
        assert_eq!(s.seq, 7);
        assert_eq!(s.tokens_per_s, 250.0);
        assert_eq!(s.interval_s, 1.0);
        assert_eq!(s.window_s, 2.0);
        assert_eq!(s.requests.running, 3);
        assert_eq!(s.kv_tiers.len(), 1);
        assert_eq!(s.kv_tiers[0].name, "device");
        assert_eq!(s.kv_tiers[0].usage, 0.25);
        m.kv_host_blocks_total.set(400);
        m.kv_host_blocks_used.set(100);
        w.push(2.5, m.snapshot());
        let t = compute(&w, 7, 2_500, Fanout::default()).unwrap().kv_tiers;
        assert_eq!(t.len(), 2, "a host tier is the second entry");
        assert_eq!(
            (t[1].name, t[1].total_blocks, t[1].usage),
            ("host", 400, 0.25)
        );
        // The 50 observations predate the oldest sample: nothing in the window.
        assert_eq!(s.ttft_ms, None);
        assert!(s.speculative.is_none());
        // Speculation: 40 draft tokens proposed, 30 accepted in the last 0.5 s.
        m.spec_draft_tokens.inc_by(40);
        m.spec_accepted_tokens.inc_by(30);
        w.push(3.0, m.snapshot());
        let sp = compute(&w, 7, 3_000, Fanout::default())
            .unwrap()
            .speculative
            .unwrap();
        assert_eq!(
            (
                sp.acceptance_rate,
                sp.proposed_tokens_per_s,
                sp.accepted_tokens_per_s
            ),
            (0.75, 80.0, 60.0)
        );

        for _ in 0..9 {
            m.ttft.observe(0.015);
        }
        m.ttft.observe(0.3);
        w.push(3.0, m.snapshot());
        let s = compute(&w, 8, 3_000, Fanout::default()).unwrap();
        let p = s.ttft_ms.unwrap();
        assert_eq!(p.count, 10);
        assert!(p.p50 > 10.0 && p.p50 <= 20.0, "{p:?}");
        assert!(p.p99 > 200.0 && p.p99 <= 300.0, "{p:?}");
        assert_eq!(s.tokens_per_s, 0.0);
        assert_eq!(s.chart.ttft_p50_ms, Some(p.p50));
    }

    #[test]
    fn window_is_bounded_and_spans_at_least_window_s() {
        let m = Metrics::new();
        let mut w = Window::default();
        for i in 0..1000 {
            w.push(i as f64, m.snapshot());
        }
        // Oldest kept is the newest one at least WINDOW_S old.
        assert_eq!(w.len(), WINDOW_S as usize + 1);
        let s = compute(&w, 0, 0, Fanout::default()).unwrap();
        assert_eq!(s.window_s, WINDOW_S);
    }

    #[test]
    fn window_counts_and_merge_reasons() {
        let m = Metrics::new();
        let mut w = Window::default();
        m.merge_decisions.with_label_values(&["fits"]).inc_by(5);
        m.prefix_cache_queries.inc_by(100);
        m.prefix_cache_hits.inc_by(10);
        w.push(0.0, m.snapshot());
        m.merge_decisions.with_label_values(&["fits"]).inc_by(2);
        m.merge_decisions.with_label_values(&["kv_memory"]).inc();
        m.emergency_mode.set(1);
        m.emergency_pauses.inc_by(4);
        m.prefix_cache_queries.inc_by(100);
        m.prefix_cache_hits.inc_by(80);
        w.push(1.0, m.snapshot());
        let s = compute(&w, 1, 0, Fanout::default()).unwrap();
        let fits = s
            .merge_decisions
            .iter()
            .find(|c| c.label == "fits")
            .unwrap();
        assert_eq!((fits.total, fits.window, fits.merged), (7, 2, Some(true)));
        let kv = s
            .merge_decisions
            .iter()
            .find(|c| c.label == "kv_memory")
            .unwrap();
        assert_eq!((kv.total, kv.window, kv.merged), (1, 1, Some(false)));
        assert!(s.emergency.active);
        assert_eq!(s.emergency.pauses_window, 4);
        assert_eq!(s.prefix_cache.hit_rate, Some(0.8));
        assert_eq!(s.prefix_cache.hit_rate_total, Some(0.45));
    }

    #[test]
    fn serializes_null_fields_for_absent_features() {
        let m = Metrics::new();
        let mut w = Window::default();
        w.push(0.0, m.snapshot());
        let s = compute(&w, 0, 0, Fanout::default()).unwrap();
        let j = serde_json::to_value(&s).unwrap();
        assert!(j["speculative"].is_null());
        assert!(j["ttft_ms"].is_null());
        assert_eq!(j["kv_tiers"][0]["name"], "device");
        assert_eq!(j["percentiles_from"], "histogram_bucket_deltas");
    }
}
