//! What one `schedule()` hands to the executor: per scheduled request only what changed since
//! the executor last saw it (as vLLM v1's `NewRequestData` / `CachedRequestData`), plus the ids
//! it must forget. The executor keeps everything else (tokens so far, block tables) itself.

use std::sync::Arc;

use super::kv_copy::BlockCopy;
use crate::request::{FinishReason, RequestId};
use crate::sampling::params::SamplingParams;

/// The plan of one engine step.
#[derive(Debug, Clone, Default)]
pub struct SchedulerOutput {
    /// The requests computed this step, in batch order.
    pub scheduled: Vec<ScheduledRequest>,
    /// Requests the executor holds that have ended (finished, aborted) since the last step it
    /// ran, and requests preempted in steps it never saw: it drops them before this step.
    pub finished_req_ids: Vec<RequestId>,
    /// Requests preempted by recompute in this step (back in the waiting queue, blocks freed);
    /// the executor drops them too. Their tokens and blocks come again, whole, on resumption.
    pub preempted: Vec<RequestId>,
    /// Requests in a batch for the first time (their queueing time ends here).
    pub admitted: Vec<RequestId>,
    /// Requests finished without running, e.g. longer than the model's context; removed and
    /// freed already, reported by `update_from_output`. The executor never saw them.
    pub finished_early: Vec<(RequestId, FinishReason)>,
    /// Tokens of prompt chunks in the batch, recomputed ones included (metrics, cost model).
    pub num_prefill_tokens: usize,
    /// Sequences in the batch that decode one token.
    pub num_decode_seqs: usize,
    /// Block copies between the KV tiers and within the device, in the order they must be
    /// applied, before this step's forward (see `step::kv_copy`). A step may carry copies and
    /// no request (requests whose blocks come back from the host compute from the next step).
    pub kv_copies: Vec<BlockCopy>,
    /// Requests whose blocks this step's copies bring back from the host tier (a swapped
    /// request resuming, a host-tier prefix hit): not computed in this step, but from the next.
    /// Should the step fail, their blocks are suspect too.
    pub loading: Vec<RequestId>,
}

/// One request's part of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledRequest {
    pub id: RequestId,
    /// Tokens with K/V in the cache before this step: this step's first position.
    pub num_computed_tokens: usize,
    /// Known tokens computed this step: a prompt chunk, or 1 for a decode.
    pub num_tokens: usize,
    /// Speculative decoding: draft positions reserved after the known tokens (0: none). Only a
    /// decode carries them (`num_tokens` 1, `sample`). The request's block table covers
    /// `num_computed_tokens + num_tokens + num_draft_tokens` positions; the executor's proposer
    /// fills up to this many with draft tokens, the target computes them after the known token
    /// (k + 1 positions), and the tokens it verifies come back in `StepOutput::sampled`. Drafts
    /// are never known tokens: the scheduler keeps only what comes back.
    pub num_draft_tokens: usize,
    /// This step reaches the end of the request's known tokens, so it samples the next one. The
    /// known tokens are then exactly `num_computed_tokens + num_tokens`: the executor drops any
    /// it appended that the scheduler did not keep.
    pub sample: bool,
    /// Blocks appended to the request's block table since the executor last saw it, in position
    /// order; with `new`, the whole table. An entry below `num_freed_blocks` may be
    /// [`NULL_BLOCK`](super::NULL_BLOCK).
    pub new_block_ids: Vec<u32>,
    /// KV rollback after rejected drafts: the executor cuts its copy of the block table to this
    /// many entries before appending `new_block_ids` (the scheduler released the blocks that
    /// held only rejected draft positions). None: nothing released since it last saw the
    /// request.
    pub truncate_blocks_to: Option<usize>,
    /// Sliding-window models: how many leading entries of the request's block table the KV
    /// manager has freed (they lie before the window of every later query) and now hold
    /// `NULL_BLOCK`. A running total that never decreases while the executor holds the request
    /// (0 under full attention): the executor sets its entries below it to `NULL_BLOCK`. This is
    /// the one diff that changes existing entries rather than appending; it travels as a count
    /// because freed entries are always a prefix.
    pub num_freed_blocks: usize,
    /// The request's full state, when the executor does not hold it: its first step, and its
    /// first step after a preemption (the executor dropped it then).
    pub new: Option<NewRequestData>,
}

/// Everything the executor keeps about a request besides its blocks, sent once.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequestData {
    /// All known tokens: the prompt, then (resumed after a preemption) the output so far.
    pub token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    pub params: Arc<SamplingParams>,
    /// `params.seed`, or the one drawn at admission.
    pub seed: u64,
}

impl SchedulerOutput {
    /// (request, tokens scheduled) in batch order.
    pub fn num_scheduled_tokens(&self) -> impl Iterator<Item = (RequestId, usize)> + '_ {
        self.scheduled.iter().map(|s| (s.id, s.num_tokens))
    }

    /// Known tokens computed this step (draft positions not included).
    pub fn total_num_scheduled_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.num_tokens).sum()
    }

    /// Draft positions reserved this step (speculative decoding).
    pub fn total_num_draft_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.num_draft_tokens).sum()
    }

    /// Requests that sample a token this step.
    pub fn num_sampled(&self) -> usize {
        self.scheduled.iter().filter(|s| s.sample).count()
    }

    /// Nothing for the executor to do: no request to compute, no block to copy and no request
    /// waiting for its copies (`update_from_output` may still report early finishes; the ids to
    /// drop wait for the next step the executor runs).
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty() && self.kv_copies.is_empty() && self.loading.is_empty()
    }
}

#[cfg(test)]
impl ScheduledRequest {
    /// Tests: a step of a request the executor already holds (no drafts, nothing freed or cut).
    pub(crate) fn running(
        id: u64,
        computed: usize,
        n: usize,
        sample: bool,
        blocks: Vec<u32>,
    ) -> Self {
        ScheduledRequest {
            id: RequestId(id),
            num_computed_tokens: computed,
            num_tokens: n,
            num_draft_tokens: 0,
            sample,
            num_freed_blocks: 0,
            truncate_blocks_to: None,
            new_block_ids: blocks,
            new: None,
        }
    }

    /// Tests: the first step of a new request, its data sent whole: `n` tokens of the prompt
    /// `token_ids`, sampling when that completes the prompt.
    pub(crate) fn first(
        id: u64,
        token_ids: Vec<u32>,
        n: usize,
        blocks: Vec<u32>,
        params: Arc<SamplingParams>,
        seed: u64,
    ) -> Self {
        let num_prompt_tokens = token_ids.len();
        ScheduledRequest {
            new: Some(NewRequestData {
                token_ids,
                num_prompt_tokens,
                params,
                seed,
            }),
            ..Self::running(id, 0, n, n == num_prompt_tokens, blocks)
        }
    }
}
