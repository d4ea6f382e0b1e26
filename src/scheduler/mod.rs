//! Continuous batching: which requests run in the next engine step and with how many tokens.
//!
//! A pure core in the style of vLLM v1: [`Scheduler::schedule`] turns the queues into one
//! flattened [`crate::executor::batch::BatchInput`] under a token budget, and
//! [`Scheduler::update_from_output`] folds the sampled tokens back into the requests and reports
//! [`RequestUpdate`]s. No clocks, I/O or threads: the scheduler actor wraps it, and the KV-block
//! manager is lent to each call.
pub mod actor;
pub mod core;
mod output;
mod request;
#[cfg(test)]
mod tests;

pub use self::core::Scheduler;
pub use self::output::{RequestUpdate, SchedulerOutput};
pub use self::request::NewRequest;

/// Limits of one engine step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Requests in the running set at most (the batch's sequence count).
    pub max_num_seqs: usize,
    /// Token budget of one step: decode tokens plus prefill-chunk tokens.
    pub max_num_batched_tokens: usize,
    /// Context length of the model; a sequence finishes with `Length` when it reaches it.
    pub max_model_len: usize,
    /// Caps one request's prefill chunk per step so that a long prompt leaves budget to others;
    /// 0 turns the cap off.
    pub long_prefill_token_threshold: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 4096,
            long_prefill_token_threshold: 0,
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
        Ok(())
    }
}
