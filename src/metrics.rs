//! Prometheus metrics with vLLM-style names. One `Metrics` value is created at start-up and
//! shared by Arc; nothing here is global.
//!
//! (Over 600 lines: one declaration and one snapshot field per metric, all alike.)

use prometheus::core::{Collector, Metric};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::error::EngineError;

pub struct Metrics {
    registry: Registry,
    pub requests_running: IntGauge,
    pub requests_waiting: IntGauge,
    pub kv_blocks_used: IntGauge,
    pub kv_blocks_total: IntGauge,
    pub kv_usage_ratio: Gauge,
    pub prompt_tokens: IntCounter,
    pub generation_tokens: IntCounter,
    pub preemptions: IntCounter,
    pub prefix_cache_queries: IntCounter,
    pub prefix_cache_hits: IntCounter,
    pub requests_finished: IntCounterVec,
    pub request_errors: IntCounterVec,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e_latency: Histogram,
    pub queue_time: Histogram,
    pub step_time: Histogram,
    pub step_tokens: Histogram,
    pub ws_connections: IntGauge,
    pub ws_rejected: IntCounterVec,
    pub ws_closes: IntCounterVec,
    pub ws_unread_bytes: IntGauge,
    pub slow_consumers: IntCounter,
    pub step_failures: IntCounterVec,
    pub merge_decisions: IntCounterVec,
    pub overloaded: IntCounterVec,
    pub accepted: IntCounterVec,
    pub emergency_mode: IntGauge,
    pub emergency_entries: IntCounter,
    pub emergency_exits: IntCounter,
    pub emergency_pauses: IntCounter,
    pub emergency_pauses_spared: IntCounter,
    /// Speculative decoding, in vLLM's terms (`spec_decode_*`).
    pub spec_drafts: IntCounter,
    pub spec_draft_tokens: IntCounter,
    pub spec_accepted_tokens: IntCounter,
    pub spec_accepted_per_pos: IntCounterVec,
    pub spec_proposed_per_pos: IntCounterVec,
    pub spec_mean_accepted_length: Gauge,
    pub spec_depth: Gauge,
    pub spec_steps: IntCounterVec,
    /// KV host tier: its blocks held by swapped requests, and its size (0: no host tier).
    pub kv_host_blocks_used: IntGauge,
    pub kv_host_blocks_total: IntGauge,
    /// Block copies between the tiers by direction (`out`: device → host, `in`: host →
    /// device, `cow`: within the device), their bytes, and whole requests swapped.
    pub kv_copy_blocks: IntCounterVec,
    pub kv_copy_bytes: IntCounterVec,
    pub kv_swapped_requests: IntCounterVec,
    /// Prompt tokens found in the host tier (part of `prefix_cache_hits`).
    pub prefix_cache_host_hits: IntCounter,
    /// Preemptions by how they gave up their blocks (`PreemptDecision`).
    pub preemption_decisions: IntCounterVec,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

/// Registers `m` in `registry` (each name once) and hands it back.
fn register<M: Collector + Clone + 'static>(registry: &Registry, m: M) -> M {
    registry
        .register(Box::new(m.clone()))
        .expect("unique metric");
    m
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            register(&registry, IntGauge::new(name, help).expect("valid metric"))
        };
        let counter = |name: &str, help: &str| {
            register(
                &registry,
                IntCounter::new(name, help).expect("valid metric"),
            )
        };
        let counter_vec = |name: &str, help: &str, label: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
            register(&registry, c)
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid metric");
            register(&registry, h)
        };
        let float_gauge = |name: &str, help: &str| {
            register(&registry, Gauge::new(name, help).expect("valid metric"))
        };
        let kv_usage_ratio = float_gauge(
            "brook:kv_cache_usage_perc",
            "KV cache usage, 0 to 1 (vLLM's name).",
        );
        Metrics {
            requests_running: gauge(
                "brook:num_requests_running",
                "Requests in the running batch.",
            ),
            requests_waiting: gauge(
                "brook:num_requests_waiting",
                "Requests waiting to be scheduled.",
            ),
            kv_blocks_used: gauge("brook:kv_cache_blocks_used", "KV blocks held by requests."),
            kv_blocks_total: gauge("brook:kv_cache_blocks_total", "KV blocks in the pool."),
            kv_usage_ratio,
            prompt_tokens: counter("brook:prompt_tokens_total", "Prompt tokens admitted."),
            generation_tokens: counter("brook:generation_tokens_total", "Tokens generated."),
            preemptions: counter(
                "brook:num_preemptions_total",
                "Sequences preempted (recompute).",
            ),
            prefix_cache_queries: counter(
                "brook:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
            ),
            prefix_cache_hits: counter(
                "brook:prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache.",
            ),
            requests_finished: counter_vec(
                "brook:request_success_total",
                "Requests finished, by finish reason.",
                "finished_reason",
            ),
            request_errors: counter_vec(
                "brook:request_errors_total",
                "Request errors, by error code.",
                "code",
            ),
            ttft: histogram(
                "brook:time_to_first_token_seconds",
                "Time to first token.",
                LATENCY_BUCKETS,
            ),
            itl: histogram(
                "brook:inter_token_latency_seconds",
                "Time between a request's successive tokens.",
                LATENCY_BUCKETS,
            ),
            e2e_latency: histogram(
                "brook:e2e_request_latency_seconds",
                "Arrival to finish.",
                LATENCY_BUCKETS,
            ),
            queue_time: histogram(
                "brook:request_queue_time_seconds",
                "Arrival to first scheduled.",
                LATENCY_BUCKETS,
            ),
            step_time: histogram(
                "brook:engine_step_duration_seconds",
                "Executor time of one engine step.",
                LATENCY_BUCKETS,
            ),
            step_tokens: histogram(
                "brook:engine_step_tokens",
                "Tokens in one engine step.",
                TOKEN_BUCKETS,
            ),
            ws_connections: gauge("brook:websocket_connections", "Open WebSocket connections."),
            ws_rejected: counter_vec(
                "brook:websocket_rejected_total",
                "WebSocket upgrades refused (API key, origin, connection limit), by reason.",
                "reason",
            ),
            ws_closes: counter_vec(
                "brook:websocket_closes_total",
                "WebSocket connections closed by the server, by reason (client: answering the \
                 client's close).",
                "reason",
            ),
            ws_unread_bytes: gauge(
                "brook:websocket_unread_bytes",
                "Output bytes produced for WebSocket clients that their sockets have not taken \
                 yet (bounded per socket by server.max_unread_bytes).",
            ),
            slow_consumers: counter(
                "brook:websocket_slow_consumers_total",
                "Sockets whose unread output passed server.max_unread_bytes: their requests \
                 were cancelled (slow_consumer).",
            ),
            step_failures: counter_vec(
                "brook:engine_step_failures_total",
                "Engine steps that failed, by kind (error, panic, timeout).",
                "kind",
            ),
            merge_decisions: counter_vec(
                "brook:scheduler_merge_decisions_total",
                "Batch-merge decisions of the adaptive policy, by reason.",
                "reason",
            ),
            overloaded: counter_vec(
                "brook:scheduler_overloaded_total",
                "Requests refused at admission, by reason.",
                "reason",
            ),
            accepted: counter_vec(
                "brook:scheduler_accepted_total",
                "Requests admitted, by class (short, medium, long).",
                "class",
            ),
            emergency_mode: gauge(
                "brook:scheduler_emergency_mode",
                "1 while P95 latency exceeds an SLO (emergency mode).",
            ),
            emergency_entries: counter(
                "brook:scheduler_emergency_entries_total",
                "Times emergency mode was entered.",
            ),
            emergency_exits: counter(
                "brook:scheduler_emergency_exits_total",
                "Times emergency mode was left.",
            ),
            emergency_pauses: counter(
                "brook:scheduler_emergency_pauses_total",
                "Long sequences paused on entering emergency mode.",
            ),
            emergency_pauses_spared: counter(
                "brook:scheduler_emergency_pauses_spared_total",
                "Long sequences not paused because the pause alone would break their own SLO.",
            ),
            spec_drafts: counter(
                "brook:spec_decode_num_drafts_total",
                "Speculative verifications: a sequence's step with at least one draft token.",
            ),
            spec_draft_tokens: counter(
                "brook:spec_decode_num_draft_tokens_total",
                "Draft tokens proposed and verified.",
            ),
            spec_accepted_tokens: counter(
                "brook:spec_decode_num_accepted_tokens_total",
                "Draft tokens accepted.",
            ),
            spec_accepted_per_pos: counter_vec(
                "brook:spec_decode_num_accepted_tokens_per_pos_total",
                "Draft tokens accepted, by draft position (0: the first draft).",
                "position",
            ),
            spec_proposed_per_pos: counter_vec(
                "brook:spec_decode_num_proposed_tokens_per_pos_total",
                "Draft tokens verified, by draft position (0: the first draft).",
                "position",
            ),
            spec_mean_accepted_length: float_gauge(
                "brook:spec_decode_mean_acceptance_length",
                "Tokens per verification since start, the target's own token included.",
            ),
            spec_depth: float_gauge(
                "brook:spec_decode_current_depth",
                "Mean draft depth given to the decodes that could speculate in the last such step.",
            ),
            spec_steps: counter_vec(
                "brook:spec_decode_steps_total",
                "Steps with speculating decodes, by what set the depth ceiling (normal, \
                 kv_pressure, emergency, warmup).",
                "ceiling",
            ),
            kv_host_blocks_used: gauge(
                "brook:kv_host_blocks_used",
                "KV host-tier blocks held by swapped-out requests.",
            ),
            kv_host_blocks_total: gauge(
                "brook:kv_host_blocks_total",
                "KV blocks in the host tier (0: none).",
            ),
            kv_copy_blocks: counter_vec(
                "brook:kv_copy_blocks_total",
                "KV block copies: out (device to host), in (host to device), cow (within the device).",
                "direction",
            ),
            kv_copy_bytes: counter_vec(
                "brook:kv_copy_bytes_total",
                "Bytes of KV block copies, by direction (out, in, cow).",
                "direction",
            ),
            kv_swapped_requests: counter_vec(
                "brook:kv_swapped_requests_total",
                "Requests swapped out to the host tier (out) and back (in).",
                "direction",
            ),
            prefix_cache_host_hits: counter(
                "brook:prefix_cache_host_hits_total",
                "Prompt tokens found in the KV host tier (and copied back).",
            ),
            preemption_decisions: counter_vec(
                "brook:kv_preemption_decisions_total",
                "Preemptions by decision: swap, recompute, recompute_host_full, recompute_no_host_tier.",
                "decision",
            ),
            registry,
        }
    }

    /// The one place errors are counted: every error on its way to a client passes here (the
    /// WS session's error frames, streamed ones included, and HTTP error responses), so each is
    /// counted once, under its metric label.
    pub fn count_error(&self, err: &EngineError) {
        self.request_errors
            .with_label_values(&[err.metric_label()])
            .inc();
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

/// Cumulative values of every metric at one instant: what the dashboard producer
/// (src/server/dashboard/) reads once per second and turns into rates and windowed percentiles
/// by differencing two snapshots. Counter vectors are (label, value) pairs sorted by label.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub requests_running: i64,
    pub requests_waiting: i64,
    pub kv_blocks_used: i64,
    pub kv_blocks_total: i64,
    pub kv_host_blocks_used: i64,
    pub kv_host_blocks_total: i64,
    pub ws_connections: i64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub preemptions: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub requests_finished: Vec<(String, u64)>,
    pub request_errors: Vec<(String, u64)>,
    pub ttft: HistogramSnapshot,
    pub itl: HistogramSnapshot,
    pub e2e_latency: HistogramSnapshot,
    pub step_time: HistogramSnapshot,
    pub step_tokens: HistogramSnapshot,
    pub merge_decisions: Vec<(String, u64)>,
    pub overloaded: Vec<(String, u64)>,
    pub emergency_mode: bool,
    pub emergency_entries: u64,
    pub emergency_exits: u64,
    pub emergency_pauses: u64,
    pub emergency_pauses_spared: u64,
    /// Speculative decoding counters (see `Metrics::spec_*`).
    pub spec_drafts: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    pub spec_depth: f64,
}

/// A histogram's cumulative buckets at one instant (finite upper bounds only; `count` is the
/// +Inf bucket).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    pub upper_bounds: Vec<f64>,
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

impl HistogramSnapshot {
    fn of(h: &Histogram) -> Self {
        let m = h.metric();
        let p = m.get_histogram();
        HistogramSnapshot {
            upper_bounds: p.get_bucket().iter().map(|b| b.upper_bound()).collect(),
            cumulative: p
                .get_bucket()
                .iter()
                .map(|b| b.cumulative_count())
                .collect(),
            count: p.get_sample_count(),
            sum: p.get_sample_sum(),
        }
    }

    /// The observations made after `earlier` (same buckets): bucket-wise differences.
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        if earlier.upper_bounds != self.upper_bounds {
            return self.clone();
        }
        HistogramSnapshot {
            upper_bounds: self.upper_bounds.clone(),
            cumulative: self
                .cumulative
                .iter()
                .zip(&earlier.cumulative)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            count: self.count.saturating_sub(earlier.count),
            sum: (self.sum - earlier.sum).max(0.0),
        }
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }

    /// The q-quantile (0 ≤ q ≤ 1) as Prometheus' `histogram_quantile` estimates it: linear
    /// interpolation inside the bucket holding rank q × count (the first bucket starts at 0);
    /// a rank in the +Inf bucket returns the largest finite bound. `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || self.upper_bounds.is_empty() {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut prev_count = 0u64;
        let mut prev_bound = 0.0;
        for (&bound, &cum) in self.upper_bounds.iter().zip(&self.cumulative) {
            if cum as f64 >= rank && cum > prev_count {
                let in_bucket = (cum - prev_count) as f64;
                let frac = ((rank - prev_count as f64) / in_bucket).clamp(0.0, 1.0);
                return Some(prev_bound + (bound - prev_bound) * frac);
            }
            prev_count = cum;
            prev_bound = bound;
        }
        self.upper_bounds.last().copied()
    }
}

/// (label value, counter value) for every child of a one-label counter vector, sorted.
fn counter_vec_values(v: &IntCounterVec) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = v
        .collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .map(|m| {
            let label = m
                .get_label()
                .first()
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            (label, m.get_counter().get_value() as u64)
        })
        .collect();
    out.sort();
    out
}

impl Metrics {
    /// Reads every metric once (cheap: atomics, plus a short lock per histogram).
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            requests_running: self.requests_running.get(),
            requests_waiting: self.requests_waiting.get(),
            kv_blocks_used: self.kv_blocks_used.get(),
            kv_blocks_total: self.kv_blocks_total.get(),
            kv_host_blocks_used: self.kv_host_blocks_used.get(),
            kv_host_blocks_total: self.kv_host_blocks_total.get(),
            ws_connections: self.ws_connections.get(),
            prompt_tokens: self.prompt_tokens.get(),
            generation_tokens: self.generation_tokens.get(),
            preemptions: self.preemptions.get(),
            prefix_cache_queries: self.prefix_cache_queries.get(),
            prefix_cache_hits: self.prefix_cache_hits.get(),
            requests_finished: counter_vec_values(&self.requests_finished),
            request_errors: counter_vec_values(&self.request_errors),
            ttft: HistogramSnapshot::of(&self.ttft),
            itl: HistogramSnapshot::of(&self.itl),
            e2e_latency: HistogramSnapshot::of(&self.e2e_latency),
            step_time: HistogramSnapshot::of(&self.step_time),
            step_tokens: HistogramSnapshot::of(&self.step_tokens),
            merge_decisions: counter_vec_values(&self.merge_decisions),
            overloaded: counter_vec_values(&self.overloaded),
            emergency_mode: self.emergency_mode.get() != 0,
            emergency_entries: self.emergency_entries.get(),
            emergency_exits: self.emergency_exits.get(),
            emergency_pauses: self.emergency_pauses.get(),
            emergency_pauses_spared: self.emergency_pauses_spared.get(),
            spec_drafts: self.spec_drafts.get(),
            spec_draft_tokens: self.spec_draft_tokens.get(),
            spec_accepted_tokens: self.spec_accepted_tokens.get(),
            spec_depth: self.spec_depth.get(),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_style_names() {
        let m = Metrics::new();
        m.requests_running.set(3);
        m.ttft.observe(0.05);
        m.count_error(&EngineError::InvalidJson("x".into()));
        let text = m.render();
        assert!(text.contains("brook:num_requests_running 3"));
        assert!(text.contains("brook:time_to_first_token_seconds_count 1"));
        assert!(text.contains(r#"brook:request_errors_total{code="invalid_json"} 1"#));
    }

    #[test]
    fn snapshot_reads_counters_vectors_and_histograms() {
        let m = Metrics::new();
        m.generation_tokens.inc_by(42);
        m.kv_blocks_total.set(100);
        m.merge_decisions.with_label_values(&["merged"]).inc_by(3);
        m.merge_decisions.with_label_values(&["kv_growth"]).inc();
        m.emergency_mode.set(1);
        m.itl.observe(0.003);
        m.itl.observe(0.5);
        let s = m.snapshot();
        assert_eq!(s.generation_tokens, 42);
        assert_eq!(s.kv_blocks_total, 100);
        assert_eq!(
            s.merge_decisions,
            vec![("kv_growth".to_owned(), 1), ("merged".to_owned(), 3)]
        );
        assert!(s.emergency_mode);
        assert_eq!(s.itl.count, 2);
        assert_eq!(s.itl.upper_bounds, LATENCY_BUCKETS);
        // 0.003 lands in (0.0025, 0.005], 0.5 in (0.4, 0.5].
        assert_eq!(s.itl.cumulative[1], 0);
        assert_eq!(s.itl.cumulative[2], 1);
        assert_eq!(s.itl.cumulative[13], 2);
    }

    fn hist(bounds: &[f64], per_bucket: &[u64]) -> HistogramSnapshot {
        let mut cum = 0;
        let cumulative: Vec<u64> = per_bucket
            .iter()
            .take(bounds.len())
            .map(|n| {
                cum += n;
                cum
            })
            .collect();
        HistogramSnapshot {
            upper_bounds: bounds.to_vec(),
            cumulative,
            count: per_bucket.iter().sum(),
            sum: 0.0,
        }
    }

    #[test]
    fn quantile_interpolates_inside_the_bucket_like_prometheus() {
        // 10 observations in (0, 1], 10 in (1, 2].
        let h = hist(&[1.0, 2.0, 4.0], &[10, 10, 0, 0]);
        assert_eq!(h.quantile(0.5), Some(1.0));
        assert_eq!(h.quantile(0.25), Some(0.5));
        assert!((h.quantile(0.75).unwrap() - 1.5).abs() < 1e-12);
        assert_eq!(h.quantile(1.0), Some(2.0));
        // Ranks in the +Inf bucket report the largest finite bound.
        let tail = hist(&[1.0, 2.0], &[1, 0, 9]);
        assert_eq!(tail.quantile(0.99), Some(2.0));
        assert_eq!(HistogramSnapshot::default().quantile(0.5), None);
    }

    #[test]
    fn since_keeps_only_the_later_observations() {
        let m = Metrics::new();
        for _ in 0..100 {
            m.ttft.observe(5.0);
        }
        let before = m.snapshot().ttft;
        for _ in 0..10 {
            m.ttft.observe(0.015);
        }
        let d = m.snapshot().ttft.since(&before);
        assert_eq!(d.count, 10);
        assert!((d.sum - 0.15).abs() < 1e-9);
        // All in (0.01, 0.02]: the window's P99 ignores the 100 slow ones before it.
        let p99 = d.quantile(0.99).unwrap();
        assert!(p99 > 0.01 && p99 <= 0.02, "{p99}");
        assert!((d.mean().unwrap() - 0.015).abs() < 1e-9);
    }
}
