//! Prometheus metrics with vLLM-style names. One `Metrics` value is created at start-up and
//! shared by Arc; nothing here is global.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

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
    pub merge_decisions: IntCounterVec,
    pub overloaded: IntCounterVec,
    pub accepted: IntCounterVec,
    pub emergency_mode: IntGauge,
    pub emergency_entries: IntCounter,
    pub emergency_exits: IntCounter,
    pub emergency_pauses: IntCounter,
    pub emergency_pauses_spared: IntCounter,
    pub speculative_depth: IntGauge,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let counter_vec = |name: &str, help: &str, label: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid metric");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        let kv_usage_ratio = Gauge::new(
            "brook:kv_cache_usage_perc",
            "KV cache usage, 0 to 1 (vLLM's name).",
        )
        .expect("valid metric");
        registry
            .register(Box::new(kv_usage_ratio.clone()))
            .expect("unique metric");
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
            speculative_depth: gauge(
                "brook:scheduler_speculative_depth",
                "Speculative-decoding depth the scheduler allows now.",
            ),
            registry,
        }
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
        m.request_errors.with_label_values(&["invalid_json"]).inc();
        let text = m.render();
        assert!(text.contains("brook:num_requests_running 3"));
        assert!(text.contains("brook:time_to_first_token_seconds_count 1"));
        assert!(text.contains(r#"brook:request_errors_total{code="invalid_json"} 1"#));
    }
}
