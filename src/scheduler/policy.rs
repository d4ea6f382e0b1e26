//! The batch-merge policy of the adaptive scheduler.
//!
//! Each step starts from the running decodes (always in: their ITL is what the policy protects)
//! and then considers candidate batches lane by lane ([`Lane`]): fast-lane prefills (short
//! prompts), resumed preempted sequences, normal prefills, long-prefill chunks. [`should_merge`]
//! fuses a candidate into the step only if
//! 1. memory: the blocks it needs now and over its expected decode horizon fit under
//!    `kv_threshold` × the free blocks left after the watermark and the running requests' own
//!    expected growth (so an admission does not buy a preemption later), and
//! 2. latency: the step time predicted by the fitted [`CostModel`] after merging stays within the
//!    ITL slack of every decode in the step (the time left before its next token would push its
//!    mean inter-token latency over its SLO × `itl_headroom`, never less than that SLO × headroom
//!    itself) and within the TTFT slack of every short request still waiting outside the step.
//!
//! A prefill that does not fit whole is trimmed to the largest chunk that does (not below
//! `min_chunk_tokens`; short prompts are never split). A document whose TTFT deadline needs its
//! chunk now (`Candidate::due`, `merge.deadline_share`) is merged whole over the latency bound:
//! the decodes' ITL slack is the price of not starving it. Its chunk is sized to the step time
//! it is guaranteed (`merge.doc_step_ms` over the decodes alone, or the slack when larger), so
//! the step stays short: small steady chunks rather than one 512-token lump a step. Every decision carries a [`MergeReason`]
//! that the scheduler counts and logs.

use serde::Serialize;

use crate::scheduler::cost_model::{CostModel, StepFeatures};
use crate::scheduler::{MergeConfig, RequestClass};

/// Candidate batches, in the order the adaptive scheduler considers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// Running sequences decoding one token.
    Decode,
    /// Short prompts: first admission, whole prompt in one step.
    FastLane,
    /// Preempted or paused sequences that already produced tokens.
    Resumed,
    /// Medium prompts, chunked by `long_prefill_token_threshold`.
    Normal,
    /// Long prompts, streamed under `classes.long_prefill_budget` tokens per step.
    LongStream,
}

impl Lane {
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Decode => "decode",
            Lane::FastLane => "fast_lane",
            Lane::Resumed => "resumed",
            Lane::Normal => "normal",
            Lane::LongStream => "long_stream",
        }
    }

    pub fn of_prefill(class: RequestClass) -> Lane {
        match class {
            RequestClass::Short => Lane::FastLane,
            RequestClass::Medium => Lane::Normal,
            RequestClass::Long => Lane::LongStream,
        }
    }
}

/// Why a candidate was (or was not) merged into a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeReason {
    /// Merged whole: memory and latency within bounds.
    Fits,
    /// Merged with its chunk cut to the latency bound.
    Trimmed,
    /// Merged although over the latency bound: the step had no prefill, and waiting requests
    /// must progress (only short prompts when `merge.deadline_share` is on).
    Progress,
    /// Not merged: its blocks now plus its expected decode horizon exceed the KV threshold.
    KvMemory,
    /// Not merged: the step would exceed a running decode's ITL SLO.
    DecodeItl,
    /// Not merged: the step would push a waiting short request past its TTFT SLO.
    ShortTtft,
    /// Not merged: the step's token budget is spent.
    TokenBudget,
    /// Not merged: `max_num_seqs` sequences already run.
    SeqLimit,
    /// Not merged: the long lane's per-step budget is spent.
    LongBudget,
    /// Not merged: the KV manager had too few free blocks for the chunk.
    KvAllocation,
    /// Merged over the latency bound: a document's TTFT deadline needs the chunk now
    /// (`merge.deadline_share`).
    Deadline,
}

impl MergeReason {
    pub const ALL: [MergeReason; 11] = [
        MergeReason::Fits,
        MergeReason::Trimmed,
        MergeReason::Progress,
        MergeReason::KvMemory,
        MergeReason::DecodeItl,
        MergeReason::ShortTtft,
        MergeReason::TokenBudget,
        MergeReason::SeqLimit,
        MergeReason::LongBudget,
        MergeReason::KvAllocation,
        MergeReason::Deadline,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn merged(self) -> bool {
        matches!(
            self,
            MergeReason::Fits
                | MergeReason::Trimmed
                | MergeReason::Progress
                | MergeReason::Deadline
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MergeReason::Fits => "fits",
            MergeReason::Trimmed => "trimmed",
            MergeReason::Progress => "progress",
            MergeReason::KvMemory => "kv_memory",
            MergeReason::DecodeItl => "decode_itl",
            MergeReason::ShortTtft => "short_ttft",
            MergeReason::TokenBudget => "token_budget",
            MergeReason::SeqLimit => "seq_limit",
            MergeReason::LongBudget => "long_budget",
            MergeReason::KvAllocation => "kv_allocation",
            MergeReason::Deadline => "deadline",
        }
    }
}

/// The step so far ("a").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepDraft {
    pub features: StepFeatures,
    /// Whether a prefill chunk is in the step already.
    pub has_prefill: bool,
    /// Tightest ITL slack over the decodes in the step, ms (infinite with none): how long the
    /// step may take before one of them misses its mean-ITL SLO × headroom.
    pub itl_target_ms: f64,
}

impl StepDraft {
    pub fn new() -> Self {
        StepDraft {
            features: StepFeatures::default(),
            has_prefill: false,
            itl_target_ms: f64::INFINITY,
        }
    }

    pub fn add_decode(&mut self, context_len: usize, itl_target_ms: f64) {
        self.features.add_seq(1, context_len);
        self.itl_target_ms = self.itl_target_ms.min(itl_target_ms);
    }

    /// A decode's draft positions (speculative decoding): extra query rows, costed as prefill
    /// rows (the step-time fit counts them so).
    pub fn add_verification(&mut self, drafts: usize) {
        self.features.prefill_tokens += drafts as f64;
    }

    pub fn add_prefill(&mut self, num_computed: usize, tokens: usize) {
        self.features.add_seq(tokens, num_computed + tokens);
        self.has_prefill = true;
    }
}

impl Default for StepDraft {
    fn default() -> Self {
        Self::new()
    }
}

/// One prefill candidate ("b").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub lane: Lane,
    /// Tokens already in the cache (the chunk's context starts there).
    pub num_computed: usize,
    /// Tokens it would compute this step, after the lane's caps.
    pub wanted: usize,
    /// Smallest acceptable chunk (the whole prompt for a short request).
    pub min_tokens: usize,
    /// Blocks it needs now and over its expected decode horizon; 0 for a running request (its
    /// need is already reserved).
    pub kv_blocks_needed: usize,
    /// Its TTFT deadline needs this chunk now (`merge.deadline_share`): merged over the latency
    /// bound, trimmed to `MergeContext::doc_floor_ms` (not below the smallest chunk).
    pub due: bool,
}

/// What the step leaves for the candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MergeContext {
    pub token_budget_left: usize,
    /// Whether one more sequence may join (a waiting candidate joins the running set).
    pub seq_available: bool,
    /// Free blocks after the watermark and the running requests' expected growth, × threshold.
    pub kv_headroom_blocks: f64,
    /// Nothing runs: a candidate that needs more than the headroom is still admitted, or it
    /// would never run.
    pub running_is_empty: bool,
    /// Tightest TTFT slack (ms) among short requests waiting outside the step, their own
    /// prefill step deducted (infinite with none).
    pub short_ttft_slack_ms: f64,
    /// A due document's chunk (`Candidate::due`) may fill the step up to this long whatever
    /// the slack above says: the step's decodes alone plus `merge.doc_step_ms`.
    pub doc_floor_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MergeDecision {
    pub reason: MergeReason,
    /// Tokens to schedule (0 when not merged).
    pub tokens: usize,
}

impl MergeDecision {
    fn no(reason: MergeReason) -> Self {
        MergeDecision { reason, tokens: 0 }
    }
}

/// Whether to fuse candidate `b` into step `a`, and with how many tokens.
pub fn should_merge(
    model: &CostModel,
    cfg: &MergeConfig,
    a: &StepDraft,
    b: &Candidate,
    ctx: &MergeContext,
) -> MergeDecision {
    if !ctx.seq_available {
        return MergeDecision::no(MergeReason::SeqLimit);
    }
    let wanted = b.wanted.min(ctx.token_budget_left);
    if wanted == 0 || wanted < b.min_tokens.min(b.wanted) {
        return MergeDecision::no(MergeReason::TokenBudget);
    }
    if b.kv_blocks_needed as f64 > ctx.kv_headroom_blocks && !ctx.running_is_empty {
        return MergeDecision::no(MergeReason::KvMemory);
    }
    let (cap_ms, cap_reason) = if a.itl_target_ms <= ctx.short_ttft_slack_ms {
        (a.itl_target_ms, MergeReason::DecodeItl)
    } else {
        (ctx.short_ttft_slack_ms, MergeReason::ShortTtft)
    };
    let predict = |tokens: usize| {
        let mut f = a.features;
        f.add_seq(tokens, b.num_computed + tokens);
        model.predict_ms(&f)
    };
    // Whether a chunk of `t` tokens costs per token within `max_trim_cost` × the whole chunk's.
    let base = model.predict_ms(&a.features);
    let per_token = |t: usize| (predict(t) - base) / t as f64;
    let efficient = |t: usize| per_token(t) <= cfg.max_trim_cost * per_token(wanted);
    if b.due && predict(wanted) > cap_ms {
        // The largest chunk within its share (or the slack, when larger), the smallest
        // acceptable one when none is.
        let due_cap = cap_ms.max(ctx.doc_floor_ms);
        let floor = b.min_tokens.max(cfg.min_chunk_tokens.min(wanted)).max(1);
        let (mut lo, mut hi) = (floor, wanted + 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if predict(mid) <= due_cap {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        // Under the wave floor a short chunk at long context costs nearly a whole one: whole.
        let tokens = if efficient(lo) { lo } else { wanted };
        return MergeDecision {
            reason: MergeReason::Deadline,
            tokens,
        };
    }
    if predict(wanted) <= cap_ms {
        let reason = if wanted < b.wanted {
            MergeReason::Trimmed
        } else {
            MergeReason::Fits
        };
        return MergeDecision {
            reason,
            tokens: wanted,
        };
    }
    // The largest chunk within the bound: predict() grows with the chunk, so bisect.
    let floor = b.min_tokens.max(cfg.min_chunk_tokens.min(wanted)).max(1);
    if floor < wanted && predict(floor) <= cap_ms {
        let (mut lo, mut hi) = (floor, wanted);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if predict(mid) <= cap_ms {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        // A trimmed chunk costing per token over `max_trim_cost` × the whole chunk's (a short
        // chunk at long context under the kernel's wave floor) waits for a step it fits whole.
        if efficient(lo) {
            return MergeDecision {
                reason: MergeReason::Trimmed,
                tokens: lo,
            };
        }
    }
    // With deadline pull on, documents progress by their deadlines (`due`), not here: a forced
    // small chunk at long context costs a whole wave floor (issue 19, call e).
    if !a.has_prefill && (b.lane == Lane::FastLane || !cfg.deadline_share.is_finite()) {
        let tokens = if b.lane == Lane::FastLane {
            wanted
        } else {
            wanted.min(cfg.progress_tokens.max(1))
        };
        return MergeDecision {
            reason: MergeReason::Progress,
            tokens,
        };
    }
    MergeDecision::no(cap_reason)
}
