//! A request as the scheduler sees it: its tokens so far and how many have K/V in the cache.

use std::sync::Arc;

use crate::request::{FinishReason, RequestId};
use crate::sampling::params::SamplingParams;
use crate::scheduler::spec::Acceptance;
use crate::scheduler::RequestClass;
use crate::validation::ValidRequest;

/// A tokenized, validated request handed to the scheduler.
#[derive(Debug, Clone)]
pub struct NewRequest {
    pub id: RequestId,
    pub prompt_token_ids: Vec<u32>,
    pub params: Arc<SamplingParams>,
    /// `params.seed`, or one drawn at admission when the client gave none.
    pub seed: u64,
    /// The model's eos ids (one or several); ignored when `params.ignore_eos`.
    pub eos_token_ids: Arc<[u32]>,
    /// Completions to generate from the prompt (parallel sampling). Choice `i` is the request
    /// `id + i`: the caller reserves the `n` consecutive ids.
    pub n: usize,
}

impl NewRequest {
    /// A request without a seed gets a random one here, so every sampled token comes from a
    /// (seed, output index) stream.
    pub fn from_valid(id: RequestId, req: ValidRequest) -> Self {
        let n = req.n();
        let (prompt_token_ids, params, eos_token_ids) = req.into_parts();
        NewRequest {
            id,
            n,
            prompt_token_ids,
            seed: params.seed.unwrap_or_else(rand::random),
            params: Arc::new(params),
            eos_token_ids,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Waiting,
    Running,
}

#[derive(Debug)]
pub(crate) struct Request {
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Leading tokens whose K/V is in the cache (as of the last completed step).
    pub num_computed: usize,
    pub params: Arc<SamplingParams>,
    pub seed: u64,
    pub eos_token_ids: Arc<[u32]>,
    pub status: Status,
    /// Whether it has been in a batch before (a resumed preempted request has).
    pub ever_scheduled: bool,
    pub class: RequestClass,
    /// Seconds, on the caller's clock.
    pub arrival: f64,
    /// When its first and its last output token came back (None before the first).
    pub first_token_at: Option<f64>,
    pub last_token_at: Option<f64>,
    /// Paused by emergency mode: waits until emergency mode ends.
    pub paused: bool,
    /// Paused once already; a request is paused at most once, so pauses cannot thrash.
    pub was_paused: bool,
    /// Blocks of its table the executor holds, or None when the executor holds no state for
    /// it (never sent yet, or dropped at a preemption): its next step sends everything.
    pub executor_blocks: Option<usize>,
    /// Blocks were released after rejected drafts since the executor last saw the request:
    /// its next step tells it to cut its table to `executor_blocks` first.
    pub executor_cut: bool,
    /// Speculative decoding: the request's acceptance estimate; None when it may not speculate
    /// (the engine does not, or it opted out).
    pub spec: Option<Acceptance>,
    /// Choices still to fork off it (`n - 1` until the fork, then 0): it computes its prompt
    /// but the last token, then its children take its blocks (`Scheduler::fork_due`).
    pub pending_fork: usize,
    /// Waiting after a swap-out: the tokens it had computed, whose K/V waits in the host tier.
    pub swapped_computed: Option<usize>,
    /// Running, but its blocks come back from the host tier in the step being planned: it
    /// computes from the next one.
    pub loading: bool,
}

impl Request {
    pub fn new(req: NewRequest, class: RequestClass, arrival: f64) -> Self {
        Request {
            class,
            arrival,
            first_token_at: None,
            last_token_at: None,
            paused: false,
            was_paused: false,
            num_prompt_tokens: req.prompt_token_ids.len(),
            tokens: req.prompt_token_ids,
            num_computed: 0,
            params: req.params,
            seed: req.seed,
            eos_token_ids: req.eos_token_ids,
            status: Status::Waiting,
            ever_scheduled: false,
            executor_blocks: None,
            pending_fork: req.n.saturating_sub(1),
            swapped_computed: None,
            loading: false,
            executor_cut: false,
            spec: None,
        }
    }

    /// A choice forked off this request (`n > 1`): the same tokens, computed as far, its own
    /// sampling stream; it runs at once (its blocks are the parent's, shared).
    pub fn fork(&self, seed: u64) -> Request {
        Request {
            tokens: self.tokens.clone(),
            num_prompt_tokens: self.num_prompt_tokens,
            num_computed: self.num_computed,
            params: self.params.clone(),
            seed,
            eos_token_ids: self.eos_token_ids.clone(),
            status: Status::Running,
            ever_scheduled: true,
            class: self.class,
            arrival: self.arrival,
            first_token_at: None,
            last_token_at: None,
            paused: false,
            was_paused: self.was_paused,
            executor_blocks: None,
            pending_fork: 0,
            swapped_computed: None,
            loading: false,
            executor_cut: false,
            // A forked choice decodes without drafts (`Scheduler::add_request`).
            spec: None,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    /// Known tokens whose K/V is not computed yet: the rest of the prompt (or, after a
    /// preemption, of prompt and output), or the one token sampled last step.
    pub fn num_uncomputed(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// How far it may compute before its next event: all its known tokens, or, before its
    /// fork, all but the last prompt token (each choice computes that one itself).
    pub fn compute_target(&self) -> usize {
        self.tokens.len() - usize::from(self.pending_fork > 0)
    }

    /// Tokens it may compute now (`compute_target` less what is computed).
    pub fn num_schedulable(&self) -> usize {
        self.compute_target().saturating_sub(self.num_computed)
    }

    /// Sequence slots it takes: itself and the choices it will fork.
    pub fn slots(&self) -> usize {
        1 + self.pending_fork
    }

    /// Output tokens it will produce at least before it ends (one step each): all up to
    /// `max_tokens` (and the context `max_len`) when only the length can end it — eos ignored,
    /// no stop ids or strings —, else one, since any token could end it.
    pub fn min_remaining_output(&self, max_len: usize) -> usize {
        let p = &self.params;
        let by_len = max_len.saturating_sub(self.num_tokens());
        if p.ignore_eos && p.stop_token_ids.is_empty() && p.stop.is_empty() {
            let by_tokens = p.max_tokens.saturating_sub(self.num_output_tokens());
            by_tokens.min(by_len).max(1)
        } else {
            // Nothing but the length ends it before min_tokens.
            let by_min = p.min_tokens.saturating_sub(self.num_output_tokens());
            by_min.min(by_len).max(1)
        }
    }

    /// After a token was appended: why the request ends here, if it does. Length first, as vLLM
    /// does, so a max_tokens-th token that is also eos reports `length`. Before `min_tokens`
    /// tokens only the length ends it (the sampler masks eos and stop ids until then).
    pub fn check_stop(&self, max_len: usize) -> Option<FinishReason> {
        let last = *self.tokens.last()?;
        if self.tokens.len() >= max_len || self.num_output_tokens() >= self.params.max_tokens {
            Some(FinishReason::Length)
        } else if self.num_output_tokens() < self.params.min_tokens {
            None
        } else if (!self.params.ignore_eos && self.eos_token_ids.contains(&last))
            || self.params.stop_token_ids.contains(&last)
        {
            Some(FinishReason::Stop)
        } else {
            None
        }
    }
}
