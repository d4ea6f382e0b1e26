//! Continuous batching: which requests run in the next engine step and with how many tokens.
//!
//! A pure core in the style of vLLM v1: [`Scheduler::schedule`] turns the queues into one
//! step under a token budget ([`SchedulerOutput`]: per request the tokens to compute and what
//! changed since the executor last saw it; see [`crate::step`]), and
//! [`Scheduler::update_from_output`] folds the sampled tokens back into the requests and reports
//! [`RequestUpdate`]s. No clocks, I/O or threads: time comes in as explicit `now` arguments
//! (seconds since any fixed epoch), so the actor runs the core on real time and `brook simulate`
//! on simulated time. The KV-block manager is lent to each call.
//!
//! Two policies share the core ([`Policy`]): `fcfs` (a token budget, running requests first, then
//! admissions in arrival order) and `adaptive` (request classes, the batch-merge policy, the SLO
//! monitor with emergency mode; see [`policy`] and [`slo`]). Admission control applies to both.
pub mod actor;
mod admission;
mod class;
mod core;
pub mod cost_model;
mod gauges;
mod messages;
pub mod policy;
mod request;
pub mod slo;
pub mod spec;
mod stats;
pub mod swap;
#[cfg(test)]
mod tests;

use serde::Deserialize;

pub use self::admission::{Admission, OverloadReason};
pub use self::class::RequestClass;
pub use self::core::Scheduler;
pub use self::cost_model::{prefill_pairs, CostCoefficients, CostModel, StepFeatures};
pub use self::policy::{Lane, MergeReason};
pub use self::request::NewRequest;
pub use self::slo::{EmergencyTransition, SloMetric, SloMonitor};
pub use self::stats::SchedulerStats;
pub use self::swap::{PreemptDecision, PreemptionMode, SwapCost};
/// The step types the core's API takes and returns (defined in the neutral `step` module).
pub use crate::step::{RequestUpdate, SchedulerOutput};

/// Which scheduling policy the core runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Token budget; running requests first, then admissions in arrival order.
    #[default]
    Fcfs,
    /// Request classes, SLO-aware batch merging, emergency mode.
    Adaptive,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Fcfs => "fcfs",
            Policy::Adaptive => "adaptive",
        }
    }
}

/// Limits of one engine step, and the policy knobs. Every field has a default, so a TOML
/// `[scheduler]` table only names what it changes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Requests in the running set at most (the batch's sequence count).
    pub max_num_seqs: usize,
    /// Token budget of one step: decode tokens plus prefill-chunk tokens.
    pub max_num_batched_tokens: usize,
    /// Context length of the model; a sequence finishes with `Length` when it reaches it.
    pub max_model_len: usize,
    /// Caps one request's prefill chunk per step so that a long prompt leaves budget to others;
    /// 0 turns the cap off. In `adaptive`, it caps the normal lane's chunks.
    pub long_prefill_token_threshold: usize,
    /// An engine step running longer than this, in seconds, stalls the engine: every request
    /// ends with `internal` and new ones get `unavailable` until the step returns. 0 = no
    /// deadline. The scheduler actor's, not the core's: the core never sees a clock.
    pub step_timeout_s: f64,
    /// Microseconds before a step's predicted end (the fitted step-time model) at which the
    /// scheduler actor's thread stops sleeping: it keeps yielding until the step returns (at
    /// most this long past the predicted end), so the result does not wait for a parked thread
    /// to wake (~50 µs a hand-over on a VM; `brook bench --engine-loop`); and how long the
    /// executor actor's thread stays awake after a step for the next one. It costs a core for
    /// that long, plus up to 2 ms (the runtime's timer resolution), each step; 0 = off. The
    /// CPU executor runs without it (its steps use every core).
    pub prewake_us: u64,
    pub policy: Policy,
    pub classes: ClassConfig,
    pub slo: SloConfig,
    pub merge: MergeConfig,
    pub emergency: EmergencyConfig,
    pub admission: AdmissionConfig,
    /// Step-time model used until the online fit has enough samples (and as its prior).
    pub cost_fallback: CostCoefficients,
    /// With a host KV tier: swap a preempted request out or recompute it (auto: by cost).
    pub preemption_mode: PreemptionMode,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            // 0 = the model's max_position_embeddings (resolved by the engine at start).
            max_model_len: 0,
            long_prefill_token_threshold: 512,
            step_timeout_s: 60.0,
            prewake_us: 300,
            policy: Policy::Fcfs,
            classes: ClassConfig::default(),
            slo: SloConfig::default(),
            merge: MergeConfig::default(),
            emergency: EmergencyConfig::default(),
            admission: AdmissionConfig::default(),
            cost_fallback: CostCoefficients::default(),
            preemption_mode: PreemptionMode::Auto,
        }
    }
}

/// Prompt-length thresholds of the request classes (seed: < 128 short, > 8k long).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassConfig {
    /// Prompts shorter than this are `short`: the fast lane.
    pub short_below: usize,
    /// Prompts longer than this are `long`: streaming prefill.
    pub long_above: usize,
    /// Most tokens of long-prompt prefill in one step (all long requests together), so a document
    /// streams in beside the short requests instead of blocking them.
    pub long_prefill_budget: usize,
}

impl Default for ClassConfig {
    fn default() -> Self {
        ClassConfig {
            short_below: 128,
            long_above: 8192,
            long_prefill_budget: 512,
        }
    }
}

/// Latency objectives of one class, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSlo {
    /// Time to first token, from arrival.
    pub ttft_ms: f64,
    /// Inter-token latency: the gap between two output tokens of a request.
    pub itl_ms: f64,
    /// End to end, arrival to last token (infinite: none). The adaptive policy paces the
    /// class's decodes to it: each token is due by an even share of what is left after the
    /// first token, over the expected output (`itl_step_bound_ms`), when that is tighter than
    /// `itl_ms` (issue 19: 32 tokens at a 50 ms ITL cannot end within 800 ms).
    #[serde(default = "unbounded_ms")]
    pub e2e_ms: f64,
}

fn unbounded_ms() -> f64 {
    f64::INFINITY
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SloConfig {
    pub short: ClassSlo,
    pub medium: ClassSlo,
    pub long: ClassSlo,
}

impl Default for SloConfig {
    fn default() -> Self {
        SloConfig {
            short: ClassSlo {
                ttft_ms: 300.0,
                itl_ms: 50.0,
                e2e_ms: f64::INFINITY,
            },
            medium: ClassSlo {
                ttft_ms: 800.0,
                itl_ms: 50.0,
                e2e_ms: f64::INFINITY,
            },
            long: ClassSlo {
                ttft_ms: 4000.0,
                itl_ms: 50.0,
                e2e_ms: f64::INFINITY,
            },
        }
    }
}

impl SloConfig {
    pub fn of(&self, class: RequestClass) -> ClassSlo {
        match class {
            RequestClass::Short => self.short,
            RequestClass::Medium => self.medium,
            RequestClass::Long => self.long,
        }
    }
}

/// Knobs of `should_merge` (adaptive policy).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MergeConfig {
    /// Fraction of the KV pool kept free (never planned for).
    pub kv_watermark: f64,
    /// A new request is admitted only if its blocks (prompt now, expected output later) fit in
    /// this fraction of the free blocks left after the watermark and the running requests' own
    /// expected growth.
    pub kv_threshold: f64,
    /// Expected output length before enough requests have finished to estimate it.
    pub expected_output_tokens: usize,
    /// A step is planned to take at most this fraction of the tightest ITL SLO among its decodes.
    pub itl_headroom: f64,
    /// The fraction of a request's real end-to-end slack per token left (`e2e_ms`) a step may
    /// take; default (`None`): `itl_headroom`. Its own knob because the two buy different
    /// margins: the ITL pace's headroom is all the margin a mean ITL has, while the e2e pace's
    /// margin is better set in the target itself (`e2e_ms` under what the client judges), and a
    /// headroom under 1 on top of it paces every answer tighter, at a step's base cost each.
    pub e2e_headroom: Option<f64>,
    /// Smallest prefill chunk worth trimming a candidate to; below it the candidate waits.
    pub min_chunk_tokens: usize,
    /// When a step holds no prefill at all, the first prefill candidate gets this many tokens
    /// whatever the latency prediction says, so waiting requests always progress.
    pub progress_tokens: usize,
    /// A medium or long request still waiting for its first token after this fraction of its
    /// TTFT SLO, and still able to meet it, is considered ahead of the fast lane, so a steady
    /// stream of short requests holding every sequence slot cannot starve documents. Off by
    /// default (`inf`): in the simulated e-commerce peak, where KV memory rather than slots is
    /// the limit, promoting documents cost preemptions (BENCHMARKS.md).
    pub promote_after: f64,
    /// A medium or long request waiting for its first token whose remaining prefill, predicted
    /// step by step alone with the running decodes, needs at least this fraction of the time
    /// left to its TTFT deadline is due: one such chunk per step is merged whatever the ITL and
    /// TTFT slack of others say (`MergeReason::Deadline`), so documents cannot starve behind a
    /// tight short-request pace. Off by default (`inf`).
    pub deadline_share: f64,
    /// A prefill trimmed to the latency bound is merged only while its predicted cost per token
    /// stays within this factor of the untrimmed chunk's; dearer, it waits to go whole. Under
    /// the prefill kernel's wave floor a 64-token chunk at 12k context costs nearly what 512 do
    /// (issue 19, call e). Off by default (`inf`).
    pub max_trim_cost: f64,
    /// Milliseconds of a step beyond its decodes that a due document's chunk
    /// (`deadline_share`) is guaranteed whatever the decodes' ITL slack; the chunk is trimmed
    /// to it (or to the slack when that is larger). Small: a due document then progresses in
    /// short steps the decoding requests absorb, not in lumps they cannot.
    pub doc_step_ms: f64,
    /// Documents (medium and long prompts) are offered a step's slack in one queue by TTFT
    /// deadline, earliest first, instead of every medium before any long one; those that can
    /// no longer make their deadline (past it, or their remaining prefill predicted longer
    /// than the time left) go last, oldest first. Off by default: medium before long.
    pub edf_documents: bool,
}

impl Default for MergeConfig {
    fn default() -> Self {
        MergeConfig {
            kv_watermark: 0.01,
            kv_threshold: 0.9,
            expected_output_tokens: 256,
            itl_headroom: 0.9,
            e2e_headroom: None,
            min_chunk_tokens: 32,
            progress_tokens: 64,
            promote_after: f64::INFINITY,
            deadline_share: f64::INFINITY,
            max_trim_cost: f64::INFINITY,
            doc_step_ms: 15.0,
            edf_documents: false,
        }
    }
}

/// The SLO monitor and emergency mode (adaptive policy).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmergencyConfig {
    pub enabled: bool,
    /// Sliding window of the P95s, seconds.
    pub window_s: f64,
    /// Samples per class and metric kept at most (the window is the shorter of the two).
    pub max_samples: usize,
    /// A class's P95 is judged only with at least this many samples in its window.
    pub min_samples: usize,
    /// The percentile watched.
    pub percentile: f64,
    /// Emergency mode ends once every P95 has stayed under `exit_ratio` × its SLO this long.
    pub exit_hold_s: f64,
    pub exit_ratio: f64,
    /// Sequences longer than this × the running batch's mean length are paused on entry.
    pub pause_length_factor: f64,
    /// Seconds between two evaluations of the P95s.
    pub eval_interval_s: f64,
}

impl Default for EmergencyConfig {
    fn default() -> Self {
        EmergencyConfig {
            enabled: true,
            window_s: 10.0,
            max_samples: 4096,
            min_samples: 20,
            percentile: 0.95,
            exit_hold_s: 5.0,
            exit_ratio: 1.0,
            pause_length_factor: 2.0,
            eval_interval_s: 0.25,
        }
    }
}

/// Waiting-queue bounds (both policies) and early rejection (adaptive).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    pub max_waiting_requests: usize,
    /// Prompt tokens of all waiting requests together.
    pub max_waiting_prompt_tokens: usize,
    /// Reject at once a request whose TTFT SLO its prefill alone would miss on an idle engine.
    pub early_reject: bool,
    /// Bounds of the `retry_after_ms` hint.
    pub min_retry_after_ms: u64,
    pub max_retry_after_ms: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_waiting_requests: 1024,
            max_waiting_prompt_tokens: 1 << 20,
            early_reject: true,
            min_retry_after_ms: 100,
            max_retry_after_ms: 30_000,
        }
    }
}

impl SchedulerConfig {
    /// The message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_num_seqs == 0 {
            return Err("max_num_seqs must be at least 1".into());
        }
        if self.max_num_batched_tokens == 0 {
            return Err("max_num_batched_tokens must be at least 1".into());
        }
        if self.max_model_len == 0 {
            return Err("max_model_len must be at least 1".into());
        }
        if !(self.step_timeout_s.is_finite() && self.step_timeout_s >= 0.0) {
            return Err("step_timeout_s must be a number >= 0 (0 = no deadline)".into());
        }
        let c = &self.classes;
        if c.short_below > c.long_above + 1 {
            return Err("classes.short_below must be <= classes.long_above + 1".into());
        }
        if c.long_prefill_budget == 0 {
            return Err("classes.long_prefill_budget must be at least 1".into());
        }
        for (name, s) in [
            ("short", self.slo.short),
            ("medium", self.slo.medium),
            ("long", self.slo.long),
        ] {
            if !(s.ttft_ms > 0.0 && s.itl_ms > 0.0) {
                return Err(format!("slo.{name}: ttft_ms and itl_ms must be > 0"));
            }
            if s.e2e_ms.is_nan() || s.e2e_ms <= s.ttft_ms {
                return Err(format!("slo.{name}: e2e_ms must exceed ttft_ms"));
            }
        }
        let m = &self.merge;
        if !(0.0..1.0).contains(&m.kv_watermark) {
            return Err("merge.kv_watermark must be in [0, 1)".into());
        }
        if !(m.kv_threshold > 0.0 && m.kv_threshold <= 1.0) {
            return Err("merge.kv_threshold must be in (0, 1]".into());
        }
        if !(m.itl_headroom > 0.0 && m.itl_headroom <= 1.0) {
            return Err("merge.itl_headroom must be in (0, 1]".into());
        }
        if m.e2e_headroom.is_some_and(|h| !(h > 0.0 && h <= 1.0)) {
            return Err("merge.e2e_headroom must be in (0, 1]".into());
        }
        if !m.doc_step_ms.is_finite() || m.doc_step_ms <= 0.0 {
            return Err("merge.doc_step_ms must be finite and > 0".into());
        }
        if m.max_trim_cost.is_nan() || m.max_trim_cost < 1.0 {
            return Err("merge.max_trim_cost must be >= 1 (inf: off)".into());
        }
        if m.deadline_share.is_nan() || m.deadline_share <= 0.0 {
            return Err("merge.deadline_share must be > 0 (inf: off)".into());
        }
        let e = &self.emergency;
        if !(e.percentile > 0.0 && e.percentile < 1.0) {
            return Err("emergency.percentile must be in (0, 1)".into());
        }
        if !(e.window_s > 0.0 && e.max_samples > 0 && e.pause_length_factor >= 1.0) {
            return Err(
                "emergency: window_s and max_samples must be > 0, pause_length_factor >= 1".into(),
            );
        }
        let a = &self.admission;
        if a.max_waiting_requests == 0 || a.max_waiting_prompt_tokens == 0 {
            return Err(
                "admission: max_waiting_requests and max_waiting_prompt_tokens must be > 0".into(),
            );
        }
        if a.min_retry_after_ms > a.max_retry_after_ms {
            return Err("admission.min_retry_after_ms must be <= max_retry_after_ms".into());
        }
        self.cost_fallback.validate()?;
        Ok(())
    }
}
