//! The proposer seam: given a request's known tokens, guess up to k next tokens. The executor
//! calls its proposer once per step for the requests the scheduler gave draft positions, then
//! verifies the guesses with the target (`sampling::rejection`).

use std::sync::Arc;

use crate::request::RequestId;
use crate::sampling::params::SamplingParams;

/// One request to propose for.
#[derive(Debug, Clone, Copy)]
pub struct ProposeRequest<'a> {
    pub id: RequestId,
    /// Every known token: prompt, then output so far. The last one is computed by the target in
    /// this step, together with the drafts.
    pub tokens: &'a [u32],
    /// The request's block table (a draft model's K/V uses the same block ids).
    pub block_table: &'a [u32],
    /// Most drafts to propose (the depth the scheduler chose, >= 1).
    pub max_drafts: usize,
    pub params: &'a Arc<SamplingParams>,
    pub seed: u64,
    /// Output index of the first draft (draft j stands at `output_index + j`).
    pub output_index: usize,
}

/// What a proposer guessed for one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proposal {
    /// 0..=max_drafts tokens.
    pub tokens: Vec<u32>,
    /// For drafts sampled from a model (a sampled request): the distribution each was drawn
    /// from, `[tokens.len(), vocab]`, each row summing to 1 (`rejection::filtered_dense`).
    /// Empty: proposed deterministically (greedy drafts, n-gram), a point mass on each token.
    pub probs: Vec<f32>,
}

/// Counters of one `propose` call, for the cost model and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProposeStats {
    /// Forward passes of a draft model, and the tokens they computed.
    pub passes: usize,
    pub tokens: usize,
}

/// Proposes drafts. Lives on the executor's thread, next to the backend.
pub trait Proposer: Send {
    /// One proposal per request, in order, into `out` (cleared first).
    fn propose(
        &mut self,
        reqs: &[ProposeRequest],
        out: &mut Vec<Proposal>,
    ) -> anyhow::Result<ProposeStats>;

    /// The executor dropped the request (finished, aborted, preempted): forget its state.
    fn forget(&mut self, _id: RequestId) {}
}
