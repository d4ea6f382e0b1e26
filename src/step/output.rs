//! What the executor hands back after a step.

use std::time::Duration;

use crate::request::RequestId;

/// The step's sampled tokens, in seq order. A sequence that verified drafts (speculative
/// decoding) has consecutive entries: its accepted drafts, then the target's own token (the
/// correction of the first rejected draft, or the bonus token after all of them).
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    pub sampled: Vec<SampledToken>,
    /// Wall time the backend spent on the step (proposing, forward, sampling), for the cost
    /// model and metrics.
    pub elapsed: Duration,
    /// Speculative decoding: what the proposer did (empty without drafts).
    pub spec: SpecOutput,
    /// One entry per sampled token whose request asked for log-probabilities
    /// (`params.logprobs`), in `sampled` order; empty otherwise (no allocation). Such requests
    /// are never given drafts (`SamplingParams::may_speculate`), so each has one token a step.
    pub top_logprobs: Vec<TopLogprobs>,
}

/// The most likely tokens at one sampled position, as (id, log-probability), most likely first;
/// `params.logprobs` of them (none for `Some(0)`: the sampled token's own is in `SampledToken`).
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprobs {
    pub request_id: RequestId,
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    pub request_id: RequestId,
    pub token: u32,
    pub logprob: f32,
}

/// The proposer's part of a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecOutput {
    /// One per sequence scheduled with draft positions, in seq order.
    pub drafts: Vec<DraftOutcome>,
    /// Part of `StepOutput::elapsed` spent proposing (the draft model's passes, n-gram lookups).
    pub elapsed: Duration,
    /// Draft-model forward passes run, and the tokens they computed (catch-up included); 0 for
    /// a proposer without a model.
    pub passes: usize,
    pub tokens: usize,
}

/// How one sequence's drafts fared: `proposed` of its reserved positions filled (a proposer may
/// find fewer), the first `accepted` of them kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftOutcome {
    pub request_id: RequestId,
    pub proposed: usize,
    pub accepted: usize,
}
