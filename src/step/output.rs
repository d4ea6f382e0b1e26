//! What the executor hands back after a step.

use crate::request::RequestId;

/// One sampled token for each sequence whose `sample` was Some, in seq order.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    pub sampled: Vec<SampledToken>,
    /// Wall time the backend spent on the step (forward + sampling), for the cost model and metrics.
    pub elapsed: std::time::Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    pub request_id: RequestId,
    pub token: u32,
    pub logprob: f32,
}
