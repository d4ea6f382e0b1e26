//! Test harness for the backends on the serving path, shared by the CPU backend's unit tests,
//! tests/kv_tier_cpu.rs and the CUDA end-to-end tests: a real scheduler's steps through
//! `Backend::execute` until every request finishes (also with the KV host tier), and the tally
//! that compares greedy tokens with a reference away from near ties.
//!
//! Test-only, and kept out of the release binary like `model/testing.rs`: the library's unit
//! tests compile it as `executor::testing` (`#[cfg(test)]`), tests/cuda_e2e.rs and
//! tests/kv_tier_cpu.rs include this file with `#[path]`. Paths go through `brook::`, which
//! names the library in all three.

use std::sync::Arc;

use brook::executor::backend::Backend;
use brook::kv::KvCacheManager;
use brook::request::{RequestId, TokenLogprobs};
use brook::sampling::params::SamplingParams;
use brook::sampling::sampler::argmax;
use brook::scheduler::{
    Admission, NewRequest, PreemptDecision, PreemptionMode, Scheduler, SchedulerConfig, SwapCost,
};
use brook::step::StepOutput;

/// The scheduler of these tests: `max_num_seqs` rows, a `max_num_batched_tokens` budget, and
/// long prompts chunked like any other (no long-prefill threshold); a test overrides the rest.
pub fn scheduler_config(
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    max_model_len: usize,
) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        long_prefill_token_threshold: 0,
        ..SchedulerConfig::default()
    }
}

/// Greedy `max_tokens` tokens, past any eos (so every request runs its full length).
pub fn greedy_ignoring_eos(max_tokens: usize) -> Arc<SamplingParams> {
    Arc::new(SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    })
}

/// What a run produced, indexed by prompt.
#[derive(Debug, Default)]
pub struct Run {
    pub tokens: Vec<Vec<u32>>,
    /// One entry per token where the request asked for logprobs, else empty.
    pub logprobs: Vec<Vec<TokenLogprobs>>,
    /// The most blocks one scheduled request freed in a step (behind a sliding window).
    pub most_freed: usize,
}

/// Adds prompt `i` as request `i` (seed `i`, `params[i]`, eos id 0), then steps the scheduler
/// and `backend` until all have finished. Panics when simulated time passes 100 s (no progress).
pub fn run_to_completion<B: Backend + ?Sized>(
    backend: &mut B,
    kv: &mut KvCacheManager,
    sched: &mut Scheduler,
    prompts: &[Vec<u32>],
    params: &[Arc<SamplingParams>],
) -> Run {
    assert_eq!(prompts.len(), params.len());
    for (i, (p, params)) in prompts.iter().zip(params).enumerate() {
        let req = NewRequest {
            id: RequestId(i as u64),
            prompt_token_ids: p.clone(),
            params: params.clone(),
            seed: i as u64,
            eos_token_ids: Arc::from(vec![0u32]),
            n: 1,
        };
        assert_eq!(sched.add_request(req, 0.0), Admission::Accepted);
    }
    let mut run = Run {
        tokens: vec![Vec::new(); prompts.len()],
        logprobs: vec![Vec::new(); prompts.len()],
        most_freed: 0,
    };
    let mut t = 0.0;
    while sched.has_unfinished() {
        let out = sched.schedule(kv, t);
        for s in &out.scheduled {
            run.most_freed = run.most_freed.max(s.num_freed_blocks);
        }
        let step = if out.is_empty() {
            StepOutput::default()
        } else {
            backend.execute(&out).unwrap()
        };
        t += 0.01;
        for u in sched.update_from_output(&out, &step, kv, t) {
            let i = u.id.0 as usize;
            if params[i].logprobs.is_some() {
                assert_eq!(u.logprobs.len(), u.new_token_ids.len());
            }
            run.tokens[i].extend(u.new_token_ids);
            run.logprobs[i].extend(u.logprobs);
        }
        assert!(t < 100.0, "no progress");
    }
    run
}

/// What a KV-tier run produced: outputs by request id, how many preemptions swapped, the
/// copy-on-write blocks, and how many copies ran under a forward (past `kv_copies_for_forward`).
#[derive(Debug)]
pub struct TierRun {
    pub tokens: Vec<Vec<u32>>,
    pub swaps: u64,
    pub cow_blocks: u64,
    pub overlapped_copies: usize,
}

/// Runs `prompts` (request `i * n`, `n` choices each, greedy `max_tokens` past eos) through a
/// new scheduler (`max_num_seqs` 8, a 64-token budget, preemption `mode`, the backend's host
/// tier and copy bandwidth) on `backend` until all have finished; checks that neither tier
/// leaks a block. Err: the first step the backend refused. The backend must be fresh: one
/// serves one scheduler for its life (the requests finishing in the last step stay in its
/// persistent batch, and the ids repeat).
pub fn run_with_kv_tier<B: Backend + ?Sized>(
    backend: &mut B,
    prompts: &[Vec<u32>],
    n: usize,
    max_tokens: usize,
    mode: PreemptionMode,
) -> anyhow::Result<TierRun> {
    let info = backend.info();
    let mut kv = KvCacheManager::new(info.num_kv_blocks, info.block_size, true)
        .with_host_tier(info.num_host_blocks);
    let mut sched = Scheduler::new(SchedulerConfig {
        preemption_mode: mode,
        ..scheduler_config(8, 64, 2048)
    });
    if info.num_host_blocks > 0 {
        sched.set_swap_cost(Some(SwapCost {
            bytes_per_block: info.bytes_per_block,
            bytes_per_s: info.copy_bytes_per_s,
        }));
    }
    let params = greedy_ignoring_eos(max_tokens);
    for (i, p) in prompts.iter().enumerate() {
        let req = NewRequest {
            id: RequestId((i * n) as u64),
            prompt_token_ids: p.clone(),
            params: params.clone(),
            seed: 0,
            eos_token_ids: Arc::from(vec![0u32]),
            n,
        };
        assert_eq!(sched.add_request(req, 0.0), Admission::Accepted);
    }
    let mut tokens = vec![Vec::new(); prompts.len() * n];
    let (mut t, mut overlapped_copies) = (0.0, 0);
    while sched.has_unfinished() {
        t += 0.01;
        let out = sched.schedule(&mut kv, t);
        overlapped_copies += out.kv_copies.len() - out.kv_copies_for_forward;
        let step = if out.is_empty() {
            StepOutput::default()
        } else {
            backend.execute(&out)?
        };
        for u in sched.update_from_output(&out, &step, &mut kv, t) {
            tokens[u.id.0 as usize].extend(u.new_token_ids);
        }
        assert!(t < 100.0, "no progress");
    }
    assert_eq!(kv.usage().used_blocks, 0, "device blocks leaked");
    assert_eq!(
        kv.host_usage().map_or(0, |h| h.used_blocks),
        0,
        "host blocks leaked"
    );
    Ok(TierRun {
        tokens,
        swaps: sched.stats().preempt_count(PreemptDecision::Swap),
        cow_blocks: kv.tier_stats().cow_blocks,
        overlapped_copies,
    })
}

/// Near-tie: the reference's top two logits within 1% of the logits' spread (bf16 weights move
/// logits by about that much).
pub const NEAR_TIE: f32 = 1e-2;

/// Gap between the best and second-best logit, relative to the logits' spread.
pub fn top2_gap(l: &[f32]) -> f32 {
    let (i, m) = argmax(l);
    let second = l
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i as usize)
        .map(|(_, v)| *v)
        .fold(f32::NEG_INFINITY, f32::max);
    let spread = l
        .iter()
        .map(|v| (v - m).abs())
        .fold(0f32, f32::max)
        .max(1e-6);
    (m - second) / spread
}

/// Greedy tokens against a reference's logits.
#[derive(Default, Debug)]
pub struct Tally {
    pub compared: usize,
    pub mismatches: usize,
    pub near_tie_mismatches: usize,
    pub worst_rel_err: f64,
}

impl Tally {
    /// Counts `token` against the argmax of `reference`; true for a mismatch away from a near
    /// tie.
    pub fn check(&mut self, reference: &[f32], token: u32) -> bool {
        self.compared += 1;
        if argmax(reference).0 == token {
            return false;
        }
        if top2_gap(reference) < NEAR_TIE {
            self.near_tie_mismatches += 1;
            false
        } else {
            self.mismatches += 1;
            true
        }
    }

    /// No mismatch away from near ties, and near-tie flips in at most 5% of the tokens.
    pub fn assert_close(&self, what: &str) {
        assert_eq!(self.mismatches, 0, "{what}: {self:?}");
        assert!(
            self.near_tie_mismatches * 20 <= self.compared,
            "{what}: too many near-tie flips: {self:?}"
        );
    }
}
