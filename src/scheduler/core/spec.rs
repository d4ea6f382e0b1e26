//! Speculative decoding in the core: each step's depth plan (`scheduler::spec`), each decode's
//! draft positions, and after the step the verified tokens' bookkeeping — acceptance
//! estimates, counters, the cost fits, and the KV rollback of rejected positions.

use super::Scheduler;
use crate::kv::KvCacheManager;
use crate::request::RequestId;
use crate::scheduler::cost_model::{CostModel, StepFeatures};
use crate::scheduler::spec::{
    self, Acceptance, Ceiling, DepthChoice, DraftCost, SpecStats, VerifyCost, MIN_FIT_STEPS,
    PROBE_ACCEPTANCE, PROBE_DEPTH,
};
use crate::scheduler::CostCoefficients;
use crate::spec::{SpecConfig, SpecMethod};
use crate::step::{DraftOutcome, SchedulerOutput, StepOutput};

/// Acceptance below which a request does not probe the draft model's cost (see `draft_depth`).
const COST_PROBE_MIN_RATE: f64 = 0.5;
/// A step measured above this many times its fit's prediction is left out of the fit.
const SPIKE: f64 = 3.0;
/// Engine-wide acceptance weight per verification (slower than a request's own).
const ENGINE_EMA: f64 = 0.02;
/// What the core keeps for speculation.
#[derive(Debug)]
pub(crate) struct SpecState {
    pub cfg: SpecConfig,
    /// Step-time fit of the target over steps without drafts, ready after `MIN_FIT_STEPS`
    /// steps; separate from the policy's own fit, which waits longer.
    pub target: CostModel,
    /// What drafts add to the target's step, over that fit.
    pub verify: VerifyCost,
    pub draft: DraftCost,
    pub stats: SpecStats,
    /// Acceptance over every request's verifications.
    pub engine: Acceptance,
    /// This step's depth plan, and the ceiling the rules allowed (before the cost model).
    pub choice: DepthChoice,
    ceiling: usize,
    /// Depths given this step to decodes that could speculate, and how many such decodes.
    depth_sum: usize,
    depth_seqs: usize,
    /// Decodes given drafts this step while the draft model's cost is unmeasured (`probing`).
    probes: usize,
}

impl SpecState {
    pub fn new(cfg: SpecConfig, fallback: CostCoefficients) -> Self {
        SpecState {
            target: CostModel::with_min_samples(fallback, MIN_FIT_STEPS),
            verify: VerifyCost::default(),
            draft: DraftCost::default(),
            stats: SpecStats::default(),
            engine: Acceptance::new(cfg.acceptance_prior),
            choice: DepthChoice::NONE,
            ceiling: 0,
            depth_sum: 0,
            depth_seqs: 0,
            probes: 0,
            cfg,
        }
    }
}

impl SpecState {
    /// The adaptive policy has not yet measured the draft model's cost well (its fit starts at
    /// zero cost): for its first `MIN_FIT_STEPS` drafting steps one decode per step probes it,
    /// at the rules' ceiling whatever the cost model says, and no other decode drafts. Why not
    /// let the cost model choose from the start: with a zero draft cost it sends the whole
    /// batch, and a request's first drafts include the draft model's catch-up over its prompt
    /// (measured on the CPU at batch 64: one such step took 223 ms of drafting against 16 ms
    /// for a decode step); and a fit from one catch-up-heavy step cannot split the time between
    /// passes and tokens, which can price drafting out for good (no more samples come at k = 0).
    fn probing(&self) -> bool {
        self.cfg.adaptive
            && self.cfg.method == SpecMethod::Draft
            && self.draft.samples() < MIN_FIT_STEPS
    }
}

impl Scheduler {
    /// The acceptance estimate a new request starts with; None when it may not speculate.
    pub(super) fn spec_for_new(&self, opted_in: bool) -> Option<Acceptance> {
        (self.spec.cfg.enabled() && opted_in)
            .then(|| Acceptance::new(self.spec.cfg.acceptance_prior))
    }

    /// Chooses this step's depth plan from the running decodes, before they are walked.
    pub(super) fn plan_speculation(&mut self, kv: &KvCacheManager) {
        self.spec.choice = DepthChoice::NONE;
        self.spec.ceiling = 0;
        (self.spec.depth_sum, self.spec.depth_seqs, self.spec.probes) = (0, 0, 0);
        if !self.spec.cfg.enabled() {
            return;
        }
        let mut decodes = StepFeatures::default();
        let mut alphas = Vec::new();
        let mut others = 0;
        let mut catch_up = 0;
        let retry_rate = self.retry_rate();
        for id in &self.running {
            let r = &self.requests[id];
            if r.num_uncomputed() != 1 {
                continue;
            }
            decodes.add_seq(1, r.num_computed + 1);
            match &r.spec {
                Some(a) => {
                    // A request whose probe is due is planned at the optimistic rate: the cap
                    // then says whether a probe pays at this step's size.
                    let due = a.probe_due();
                    alphas.push(match due {
                        true => a.rate().max(retry_rate),
                        false => a.rate(),
                    });
                    // The executor dropped its state (preempted): the draft model starts over.
                    let synced = if r.executor_blocks.is_some() {
                        a.synced
                    } else {
                        0
                    };
                    // What a step of drafting feeds anyway (the last verification's accepted
                    // tokens) is in the draft's fit; beyond that is catch-up.
                    let behind = (r.num_tokens() - synced.min(r.num_tokens()))
                        .saturating_sub(self.spec.cfg.max_depth + 1);
                    // A due request's catch-up is what its held steps would each have cost the
                    // draft model (about a token a step): spread over them, so that the longer
                    // the back-off held it the less likely it is probed, which would defeat it.
                    catch_up += match due {
                        true => behind.div_ceil(a.held_steps().max(1) as usize),
                        false => behind,
                    };
                }
                None => others += 1,
            }
        }
        if alphas.is_empty() {
            return;
        }
        let usage = kv.usage().usage_ratio();
        let (max, why) = spec::ceiling(
            &self.spec.cfg,
            usage,
            self.in_emergency(),
            self.spec.target.samples(),
        );
        self.spec.stats.steps_by_ceiling[why.index()] += 1;
        self.spec.ceiling = max;
        if why != Ceiling::Normal {
            tracing::debug!(
                ceiling = why.as_str(),
                max,
                usage,
                "speculation depth ceiling"
            );
        }
        let s = &self.spec;
        self.spec.choice = match s.cfg.adaptive {
            true => spec::choose_depth(
                spec::Fits {
                    target: &s.target,
                    verify: &s.verify,
                    draft: &s.draft,
                },
                &decodes,
                &alphas,
                others,
                catch_up,
                max,
            ),
            false => DepthChoice::fixed(max),
        };
        tracing::trace!(
            cap = self.spec.choice.cap,
            decodes = decodes.decode_seqs,
            alpha_mean = alphas.iter().sum::<f64>() / alphas.len() as f64,
            verify_fixed_ms = self.spec.verify.fixed_ms(),
            per_row_ms = self.spec.verify.per_row_ms(),
            draft_pass_ms = self.spec.draft.per_pass_ms(),
            draft_token_ms = self.spec.draft.per_token_ms(),
            step0_ms = self.spec.target.predict_ms(&decodes),
            "speculation plan"
        );
    }

    /// Draft positions for decode `id` this step: its acceptance against the step's plan, and
    /// never a token past `max_tokens`, the context (`max_len`) or the budget left.
    pub(super) fn draft_depth(&mut self, id: RequestId, budget: usize, max_len: usize) -> usize {
        let choice = self.spec.choice;
        let allowed = self.spec.ceiling > 0;
        let retry_rate = self.retry_rate();
        // While probing, the step's first decode that may speculate drafts at the rules'
        // ceiling and no other does.
        let probe = match self.spec.probing() {
            true => Some(self.spec.probes == 0),
            false => None,
        };
        let req = self.requests.get_mut(&id).expect("a decode is known");
        let Some(acc) = req.spec.as_mut() else {
            return 0;
        };
        // A held request whose back-off ran out probes at the optimistic rate, with at most
        // `PROBE_DEPTH` drafts; the others go by their own estimate. A due request is always a
        // probe: the step's cap may be there only because it was planned optimistically, and
        // its own estimate against that cap (whose fixed cost is then paid) would draft it to
        // the cap as if it had earned it, and reset the back-off.
        // While the draft's cost is probed, a request whose drafts keep being rejected is held
        // like any other (its back-off makes it due again): at temperature 0.7 on the CPU pair
        // the first ≈ 40 tokens are rarely accepted, and 8 cost-probe steps at the ceiling
        // there were ≈ 6 % of a 256-token run.
        let reprobe = probe != Some(false) && acc.probe_due();
        let mut k = match probe {
            Some(true) if reprobe || acc.rate() >= COST_PROBE_MIN_RATE => self.spec.ceiling,
            Some(_) => 0,
            None if reprobe => choice.depth_for(retry_rate).min(PROBE_DEPTH),
            None => choice.depth_for(acc.rate()),
        };
        let reprobe = reprobe && k > 0;
        // The step appends at most k + 1 tokens.
        let left = req
            .params
            .max_tokens
            .saturating_sub(req.num_output_tokens())
            .min(max_len.saturating_sub(req.num_tokens()));
        k = k.min(left.saturating_sub(1)).min(budget.saturating_sub(1));
        let len = req.num_tokens();
        if let Some(acc) = req.spec.as_mut() {
            if k > 0 {
                acc.synced = len;
                acc.drafted(reprobe);
            } else if allowed && probe != Some(false) {
                acc.hold();
            }
        }
        if k > 0 {
            self.spec.probes += usize::from(probe.is_some());
        }
        self.spec.depth_sum += k;
        self.spec.depth_seqs += 1;
        k
    }

    /// The acceptance a held request is probed at: `PROBE_ACCEPTANCE` (0.9, "would drafting
    /// pay if the text had become predictable"), or the engine's rate if higher; a failed probe
    /// costs at most `PROBE_DEPTH` rows, and the back-off spaces them. Not the prior (0.7): once
    /// verification is priced with its fixed cost, a probe at 0.7 does not pay on the CPU
    /// pair, so a request held at depth 0 early in its text, where acceptance is low, was never
    /// probed again (measured: 11 of 32 drafts accepted, then none for the rest of a greedy
    /// 256-token run). Not 1: at a large batch a row that is always accepted pays about what
    /// a decode row costs, so probes fired there (test `due_probes_are_priced_out_…`).
    fn retry_rate(&self) -> f64 {
        self.spec.engine.rate().max(PROBE_ACCEPTANCE)
    }

    /// The step's decodes are planned: the depth gauge.
    pub(super) fn finish_speculation_plan(&mut self) {
        if self.spec.depth_seqs > 0 {
            self.spec.stats.current_depth =
                self.spec.depth_sum as f64 / self.spec.depth_seqs as f64;
        }
    }

    /// Feeds the step-time fits: a step without drafts the target's fit, a step with drafts
    /// the verification fit (its excess over the target fit's prediction), the proposer's
    /// time apart.
    pub(super) fn observe_spec_costs(&mut self, out: &SchedulerOutput, step: &StepOutput) {
        if !self.spec.cfg.enabled() || out.is_empty() {
            return;
        }
        let f = StepFeatures::from_step(out);
        let rows: usize = step.spec.drafts.iter().map(|d| d.proposed).sum();
        let target_ms = step.elapsed.saturating_sub(step.spec.elapsed).as_secs_f64() * 1e3;
        let draft_ms = step.spec.elapsed.as_secs_f64() * 1e3;
        let s = &mut self.spec;
        let base_ms = s.target.predict_ms(&f);
        let verify_ms = base_ms + s.verify.predict_ms(rows);
        // A step far above what its fit predicts was preempted, not slow for its shape
        // (measured on the 2-core box under load ≈ 4: decode steps of 0.6 ms at 7–12 ms now
        // and then); one such k = 0 step pulled the base's prediction to 2.5 ms for the rest
        // of a run and made every depth look cheap.
        let spike = |fitted: bool, ms: f64, predicted: f64| fitted && ms > SPIKE * predicted;
        match rows {
            0 if !spike(s.target.is_fitted(), target_ms, base_ms) => {
                s.target.observe(&f, target_ms)
            }
            0 => {}
            _ if !spike(s.verify.is_fitted(), target_ms, verify_ms) => {
                s.verify.observe(rows, target_ms - base_ms)
            }
            _ => {}
        }
        let draft_predicted = s.draft.predict_ms(step.spec.passes, step.spec.tokens);
        if !spike(
            s.draft.samples() >= MIN_FIT_STEPS,
            draft_ms,
            draft_predicted,
        ) {
            s.draft
                .observe(step.spec.passes, step.spec.tokens, draft_ms);
        }
    }

    /// One sequence's verification: its acceptance estimate and the counters.
    pub(super) fn observe_drafts(&mut self, d: &DraftOutcome) {
        let w = self.spec.cfg.acceptance_ema;
        self.spec.stats.observe(d.proposed, d.accepted);
        self.spec.engine.observe(d.proposed, d.accepted, ENGINE_EMA);
        if let Some(acc) = self
            .requests
            .get_mut(&d.request_id)
            .and_then(|r| r.spec.as_mut())
        {
            acc.observe(d.proposed, d.accepted, w);
        }
    }

    /// KV rollback after a verification: the blocks past the request's known tokens held only
    /// rejected draft positions and go back to the pool; the executor cuts its table with the
    /// request's next step.
    pub(super) fn release_rejected(&mut self, id: RequestId, kv: &mut KvCacheManager) {
        let Some(req) = self.requests.get_mut(&id) else {
            return;
        };
        if kv.free_tail(id, req.num_tokens()) > 0 {
            let len = kv.block_table(id).len();
            req.executor_blocks = req.executor_blocks.map(|n| n.min(len));
            req.executor_cut = true;
        }
    }

    /// Speculation counters since start.
    pub fn spec_stats(&self) -> &SpecStats {
        &self.spec.stats
    }

    /// The speculation config the core runs with.
    pub fn spec_config(&self) -> &SpecConfig {
        &self.spec.cfg
    }
}
