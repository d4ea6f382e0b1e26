//! What the executor hands back after a step.

use crate::request::RequestId;

/// One sampled token for each sequence whose `sample` was Some, in seq order.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    pub sampled: Vec<SampledToken>,
    /// Wall time the backend spent on the step (forward + sampling), for the cost model and metrics.
    pub elapsed: std::time::Duration,
    /// One entry per sampled token whose request asked for log-probabilities
    /// (`params.logprobs`), in `sampled` order; empty otherwise (no allocation).
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
