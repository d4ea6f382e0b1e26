//! What one `schedule()` hands to the executor, and what `update_from_output()` reports back.

use crate::request::{FinishReason, RequestId};
use crate::step::BatchInput;

/// The plan of one engine step.
#[derive(Debug, Clone, Default)]
pub struct SchedulerOutput {
    /// The flattened batch for the backend; `batch.seqs[i].query_len` is the number of tokens
    /// scheduled for that request (see [`SchedulerOutput::num_scheduled_tokens`]).
    pub batch: BatchInput,
    /// Requests preempted by recompute in this step (back in the waiting queue, blocks freed).
    pub preempted: Vec<RequestId>,
    /// Requests in a batch for the first time (their queueing time ends here).
    pub admitted: Vec<RequestId>,
    /// Requests finished without running, e.g. longer than the model's context; removed and
    /// freed already, reported by `update_from_output`.
    pub finished_early: Vec<(RequestId, FinishReason)>,
    /// Tokens of prompt chunks in the batch, recomputed ones included (metrics, cost model).
    pub num_prefill_tokens: usize,
    /// Sequences in the batch that decode one token.
    pub num_decode_seqs: usize,
}

impl SchedulerOutput {
    /// (request, tokens scheduled) in batch order.
    pub fn num_scheduled_tokens(&self) -> impl Iterator<Item = (RequestId, usize)> + '_ {
        self.batch.seqs.iter().map(|s| (s.request_id, s.query_len))
    }

    pub fn total_num_scheduled_tokens(&self) -> usize {
        self.batch.num_tokens()
    }

    /// Nothing for the executor to run (`update_from_output` may still report early finishes).
    pub fn is_empty(&self) -> bool {
        self.batch.seqs.is_empty()
    }
}
