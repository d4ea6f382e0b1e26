//! The scheduling loop: one token budget per step, running requests first, then admissions.
//!
//! `fcfs` policy: each step walks the running requests in order; each gets the tokens it has not
//! computed yet (1 for a decode, a chunk for a prompt still prefilling), capped by the remaining
//! budget and by `long_prefill_token_threshold`. In FCFS order this serves decodes first: a
//! prompt chunk only leaves budget to the requests behind it when it is its last chunk or capped.
//! When blocks run out, the lowest-priority running request (the last) is preempted by recompute
//! and the allocation retried. The rest of the budget goes to waiting requests, FCFS, as
//! prefix-cache hits plus a chunk of prompt, while `max_num_seqs` allows; those never preempt.
//!
//! `adaptive` policy: decodes first, then prefill candidates lane by lane, each fused into the
//! step only when `policy::should_merge` allows (see `scheduler::policy`); the SLO monitor may
//! switch emergency mode on, which pauses the longest sequences (see `scheduler::slo`).
//!
//! Speculative decoding (both policies): a decode may get draft positions (`spec.rs`, depth
//! from `scheduler::spec`), consuming budget and blocks; if the blocks are short it runs
//! without them rather than preempt anything. After the step only verified tokens are kept,
//! and blocks past them go back to the pool.
//!
//! Files: this one holds the state, the public API and what both policies share (budgets,
//! building the step's output, folding results back); `fcfs.rs`, `adaptive.rs` and
//! `emergency.rs` hold one policy each; `overload.rs` admission (`add_request`, overload
//! checks), `estimates.rs` the cost-model and output-length estimates, `spec.rs` speculation,
//! `tiers.rs` preemption (swap or recompute by cost), resuming swapped requests, host-tier
//! prefix hits and the fork of `n > 1` requests, `invariants.rs` the bookkeeping checks the
//! tests run.
//!
//! KV memory tier: a request whose blocks come back from the host (a swapped request resuming,
//! a prefix hit in the host tier) is `loading` for one step: it takes its sequence slot and its
//! blocks, the step carries the copies (on CUDA they overlap that step's compute), and it
//! computes from the next step.
//!
//! Time: every call that needs it takes `now`, seconds on the caller's clock (any fixed epoch).
//!
//! Contract with the caller: one step at a time. Every non-empty `SchedulerOutput` goes to the
//! executor (it carries diffs against what the executor holds, so none may be skipped), and
//! every one to `update_from_output` (with a default `StepOutput` when it was empty) before the
//! next `schedule`. Aborts and finishes may come at any time; a step's results for a request
//! that is gone are dropped, and the executor is told to drop it with the next step it runs.
//! So an executor serves one scheduler for its life: the requests that finish in the last step
//! a scheduler runs stay in the executor's persistent batch, and a second scheduler's requests
//! would reuse their ids (the batch refuses that step: "sent as new, but the executor holds it").
//!
//! Past 600 lines since speculation and logprobs met in `update_from_output`/`fold`: the loop
//! and its result folding share the step's bookkeeping; the policies are in core/ already.

mod adaptive;
mod deadlines;
mod emergency;
mod estimates;
mod fcfs;
#[cfg(test)]
mod invariants;
mod overload;
mod spec;
mod tiers;

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt};

use crate::kv::KvCacheManager;
use crate::request::{FinishReason, RequestId, TokenLogprobs};
use crate::scheduler::cost_model::{CostCoefficients, CostModel, StepFeatures};
use crate::scheduler::request::{Request, Status};
use crate::scheduler::slo::{SloMetric, SloMonitor};
use crate::scheduler::stats::SchedulerStats;
use crate::scheduler::swap::{PreemptDecision, SwapCost};
use crate::scheduler::{Policy, RequestClass, SchedulerConfig};
use crate::spec::SpecConfig;
use crate::step::{
    DraftOutcome, NewRequestData, RequestUpdate, ScheduledRequest, SchedulerOutput, StepOutput,
};

/// Finished requests before the observed mean output length replaces the configured guess.
const MIN_OUTPUT_SAMPLES: u64 = 32;
/// Weight of one finished request in the running mean output length.
const OUTPUT_EMA_ALPHA: f64 = 0.02;

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    requests: HashMap<RequestId, Request>,
    /// FCFS; preempted requests re-enter at the front.
    waiting: VecDeque<RequestId>,
    /// In admission order. `fcfs`: the last one is preempted first.
    running: Vec<RequestId>,
    stats: SchedulerStats,
    cost: CostModel,
    monitor: SloMonitor,
    /// Mean output length of finished requests (EMA), and how many fed it.
    mean_output: f64,
    num_output_samples: u64,
    /// Longest a sequence may grow (`max_len`), as of the last step: the KV pool caps it too,
    /// and admission, which sees no pool, reads it here.
    max_len_seen: usize,
    /// Requests the executor holds that ended, kept until a step it runs carries them.
    executor_drops: Vec<RequestId>,
    /// Speculative decoding: config, depth plan, fits, counters.
    spec: spec::SpecState,
    /// Copy cost of the KV host tier (None: no host tier).
    swap_cost: Option<SwapCost>,
    /// Sequence slots held for the choices running requests will fork (`Request::pending_fork`).
    fork_reserved: usize,
    /// Requests made `loading` by the step being planned.
    loading: Vec<RequestId>,
}

/// A step under construction: the budget left and the decisions so far. Scheduling policies
/// (request classes, batch merging) extend this plan and the passes that fill it.
#[derive(Debug)]
struct StepPlan {
    budget: usize,
    scheduled: Vec<Planned>,
    preempted: Vec<RequestId>,
    admitted: Vec<RequestId>,
    finished_early: Vec<(RequestId, FinishReason)>,
}

/// One request's part of the step under construction.
#[derive(Debug, Clone, Copy)]
struct Planned {
    id: RequestId,
    /// Known tokens to compute.
    tokens: usize,
    /// Draft positions reserved after them (speculative decoding).
    drafts: usize,
}

impl StepPlan {
    /// Schedules `tokens` known tokens (and `drafts` draft positions) of `id`.
    fn push(&mut self, id: RequestId, tokens: usize, drafts: usize) {
        self.scheduled.push(Planned { id, tokens, drafts });
        self.budget -= tokens + drafts;
    }
}

impl Scheduler {
    /// Panics on an invalid config (`SchedulerConfig::validate` reports it first).
    pub fn new(cfg: SchedulerConfig) -> Self {
        if let Err(e) = cfg.validate() {
            panic!("invalid scheduler config: {e}");
        }
        Scheduler {
            cost: CostModel::new(cfg.cost_fallback),
            monitor: SloMonitor::new(cfg.emergency, cfg.slo),
            mean_output: cfg.merge.expected_output_tokens as f64,
            num_output_samples: 0,
            max_len_seen: cfg.max_model_len,
            cfg,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: SchedulerStats::default(),
            executor_drops: Vec::new(),
            spec: spec::SpecState::new(SpecConfig::default(), CostCoefficients::default()),
            swap_cost: None,
            fork_reserved: 0,
            loading: Vec::new(),
        }
    }

    /// Speculative decoding per `spec` (off by default): decodes of requests that did not opt
    /// out may get draft positions (see `scheduler::spec`).
    pub fn with_speculation(mut self, spec: SpecConfig) -> Self {
        self.spec = spec::SpecState::new(spec, self.cfg.cost_fallback);
        self
    }

    /// The KV host tier's copy cost, for the swap-or-recompute decision and host-tier prefix
    /// hits (None: no host tier, preemption recomputes).
    pub fn set_swap_cost(&mut self, cost: Option<SwapCost>) {
        self.swap_cost = cost;
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn classify(&self, prompt_tokens: usize) -> RequestClass {
        RequestClass::classify(prompt_tokens, &self.cfg.classes)
    }

    /// The client cancelled or went away: the request leaves its queue and its blocks return to
    /// the pool. False when it is unknown (already finished).
    pub fn abort_request(&mut self, id: RequestId, kv: &mut KvCacheManager) -> bool {
        self.finish_request(id, FinishReason::Cancelled, kv)
    }

    /// Ends a request decided outside the scheduler (a stop string matched, or an abort).
    pub fn finish_request(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        kv: &mut KvCacheManager,
    ) -> bool {
        let Some(req) = self.requests.remove(&id) else {
            return false;
        };
        match req.status {
            Status::Waiting => self.waiting.retain(|&w| w != id),
            Status::Running => {
                self.running.retain(|&r| r != id);
                self.fork_reserved -= req.pending_fork;
            }
        }
        if req.executor_blocks.is_some() {
            self.executor_drops.push(id);
        }
        kv.free(id);
        tracing::debug!(%id, reason = reason.as_str(), "request finished outside a step");
        true
    }

    /// Whether `id` is a request the core holds (waiting or running).
    pub fn is_known(&self, id: RequestId) -> bool {
        self.requests.contains_key(&id)
    }

    /// The executor lost every request's state (its backend was rebuilt after a panic, and with
    /// it the KV host tier): each running request goes back to the front of the queue to
    /// recompute, as after a preemption by recompute (in the same order; never a swap: the
    /// device K/V is gone), swapped-out requests drop their host blocks and recompute too, and
    /// drops pending for the old backend are moot. Returns how many were running.
    pub fn executor_lost(&mut self, kv: &mut KvCacheManager) -> usize {
        self.executor_drops.clear();
        self.loading.clear();
        let running = std::mem::take(&mut self.running);
        for &id in running.iter().rev() {
            self.preempt_as(id, kv, PreemptDecision::Recompute);
        }
        for (&id, req) in &mut self.requests {
            if req.swapped_computed.take().is_some() {
                kv.free(id);
            }
        }
        running.len()
    }

    /// Every request the core holds, running or waiting.
    pub fn request_ids(&self) -> Vec<RequestId> {
        self.requests.keys().copied().collect()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn has_unfinished(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Preemptions since start, emergency pauses included (a metric counter).
    pub fn num_preemptions(&self) -> u64 {
        self.stats.preemptions
    }

    /// Decision counters since start (see [`SchedulerStats`]).
    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// The step-time model (fitted coefficients, sample count).
    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }

    /// The SLO monitor (last evaluated percentiles).
    pub fn slo_monitor(&self) -> &SloMonitor {
        &self.monitor
    }

    pub fn in_emergency(&self) -> bool {
        self.monitor.in_emergency()
    }

    /// Whether the actor should skip non-core metrics (emergency mode).
    pub fn non_core_metrics_suspended(&self) -> bool {
        self.in_emergency()
    }

    /// Plans the next step at time `now`. See the module docs for the policies.
    pub fn schedule(&mut self, kv: &mut KvCacheManager, now: f64) -> SchedulerOutput {
        self.max_len_seen = self.max_len(kv);
        self.fork_due(kv);
        let mut plan = StepPlan {
            budget: self.cfg.max_num_batched_tokens,
            scheduled: Vec::with_capacity(self.running.len() + 1),
            preempted: Vec::new(),
            admitted: Vec::new(),
            finished_early: Vec::new(),
        };
        self.plan_speculation(kv);
        match self.cfg.policy {
            Policy::Fcfs => self.schedule_fcfs(&mut plan, kv),
            Policy::Adaptive => {
                if self.cfg.emergency.enabled {
                    self.update_emergency(&mut plan, kv, now);
                }
                self.schedule_adaptive(&mut plan, kv, now);
            }
        }
        self.finish_speculation_plan();
        let out = self.build_output(plan, kv);
        tracing::debug!(
            seqs = out.scheduled.len(),
            tokens = out.total_num_scheduled_tokens(),
            drafts = out.total_num_draft_tokens(),
            prefill_tokens = out.num_prefill_tokens,
            decode_seqs = out.num_decode_seqs,
            preempted = out.preempted.len(),
            loading = out.loading.len(),
            copies = out.kv_copies.len(),
            running = self.running.len(),
            waiting = self.waiting.len(),
            "scheduled step"
        );
        out
    }

    /// Most prompt tokens one step computes for a request of `class`: the long lane streams
    /// under its own budget, the others may take a whole step.
    fn prefill_budget(&self, class: RequestClass) -> usize {
        match class {
            RequestClass::Long => self.cfg.classes.long_prefill_budget,
            _ => self.cfg.max_num_batched_tokens,
        }
    }

    /// Ends a waiting request that can never run (no tokens, longer than `max_len`, or out of
    /// output budget) with `Length`: the session rejects such prompts before; this keeps a slip
    /// from wedging the queue. True when it was dropped.
    fn drop_unschedulable(
        &mut self,
        id: RequestId,
        max_len: usize,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
    ) -> bool {
        let req = &self.requests[&id];
        if !req.tokens.is_empty()
            && req.num_tokens() <= max_len
            && req.num_output_tokens() < req.params.max_tokens
        {
            return false;
        }
        if let Some(i) = self.waiting.iter().position(|&w| w == id) {
            self.waiting.remove(i);
        }
        let req = self.requests.remove(&id).expect("checked above");
        kv.free(id);
        plan.finished_early.push((id, FinishReason::Length));
        // The choices it would have forked end with it.
        for i in 1..=req.pending_fork {
            plan.finished_early
                .push((RequestId(id.0 + i as u64), FinishReason::Length));
        }
        true
    }

    /// A waiting request whose blocks are allocated joins the running set (the caller takes it
    /// off the waiting queue).
    fn start_running(&mut self, id: RequestId, num_computed: usize, plan: &mut StepPlan) {
        self.running.push(id);
        let req = self
            .requests
            .get_mut(&id)
            .expect("a request to start is known");
        req.num_computed = num_computed;
        req.status = Status::Running;
        self.fork_reserved += req.pending_fork;
        if !req.ever_scheduled {
            req.ever_scheduled = true;
            plan.admitted.push(id);
        }
    }

    /// Tokens to compute for a request this step: all it has not computed, within the budget and
    /// the per-request prefill cap.
    fn chunk_size(&self, num_uncomputed: usize, budget: usize) -> usize {
        self.capped_chunk(num_uncomputed.min(budget))
    }

    /// `n` tokens capped by the per-request prefill cap (`long_prefill_token_threshold`).
    fn capped_chunk(&self, n: usize) -> usize {
        if self.cfg.long_prefill_token_threshold > 0 {
            n.min(self.cfg.long_prefill_token_threshold)
        } else {
            n
        }
    }

    /// A sequence may not outgrow the model's context, nor the whole KV pool (it could never
    /// be scheduled again).
    fn max_len(&self, kv: &KvCacheManager) -> usize {
        self.cfg
            .max_model_len
            .min(kv.num_blocks() * kv.block_size())
    }

    /// The step as the executor sees it: per scheduled request the tokens to compute, the
    /// blocks appended since it last saw the request (its whole state when it holds none) and
    /// how many leading blocks the sliding window has freed; the ids it must drop.
    fn build_output(&mut self, plan: StepPlan, kv: &mut KvCacheManager) -> SchedulerOutput {
        let mut scheduled = Vec::with_capacity(plan.scheduled.len());
        let (mut num_prefill_tokens, mut num_decode_seqs) = (0, 0);
        for &Planned {
            id,
            tokens: num_new,
            drafts,
        } in &plan.scheduled
        {
            let req = self
                .requests
                .get_mut(&id)
                .expect("scheduled requests are known");
            let end = req.num_computed + num_new;
            let sample = end == req.num_tokens();
            if num_new == 1 && sample && req.num_output_tokens() > 0 {
                num_decode_seqs += 1;
            } else {
                num_prefill_tokens += num_new;
            }
            let table = kv.block_table(id);
            let (new, sent) = match req.executor_blocks {
                Some(sent) => (None, sent),
                None => {
                    let new = NewRequestData {
                        token_ids: req.tokens.clone(),
                        num_prompt_tokens: req.num_prompt_tokens,
                        params: req.params.clone(),
                        seed: req.seed,
                    };
                    (Some(new), 0)
                }
            };
            debug_assert!(sent <= table.len(), "{id}: block table shrank while held");
            debug_assert!(
                drafts == 0 || (num_new == 1 && sample),
                "{id}: drafts off a decode"
            );
            let truncate_blocks_to = (req.executor_cut && new.is_none()).then_some(sent);
            req.executor_blocks = Some(table.len());
            req.executor_cut = false;
            scheduled.push(ScheduledRequest {
                id,
                num_computed_tokens: req.num_computed,
                num_tokens: num_new,
                num_draft_tokens: drafts,
                sample,
                new_block_ids: table.get(sent..).unwrap_or_default().to_vec(),
                truncate_blocks_to,
                num_freed_blocks: kv.num_freed_blocks(id),
                new,
            });
        }
        let (kv_copies, kv_copies_for_forward) = kv.take_step_copies();
        let loading = std::mem::take(&mut self.loading);
        let finished_req_ids = if scheduled.is_empty() && kv_copies.is_empty() && loading.is_empty()
        {
            // The executor does not run this step: what it must drop waits for one it runs.
            self.executor_drops.extend_from_slice(&plan.preempted);
            Vec::new()
        } else {
            std::mem::take(&mut self.executor_drops)
        };
        SchedulerOutput {
            scheduled,
            finished_req_ids,
            preempted: plan.preempted,
            admitted: plan.admitted,
            finished_early: plan.finished_early,
            num_prefill_tokens,
            num_decode_seqs,
            kv_copies,
            kv_copies_for_forward,
            loading,
        }
    }

    /// Folds a completed step into the requests: K/V computed, tokens appended, stop checks,
    /// finished requests freed. Returns an update for each request that got a token or finished.
    /// `now` is when the step's tokens came back (TTFT/ITL for the SLO monitor); `step.elapsed`
    /// feeds the step-time model.
    pub fn update_from_output(
        &mut self,
        out: &SchedulerOutput,
        step: &StepOutput,
        kv: &mut KvCacheManager,
        now: f64,
    ) -> Vec<RequestUpdate> {
        let max_len = self.max_len(kv);
        if !out.scheduled.is_empty() {
            // The target's part of the step; verification rows count as prefill rows.
            let mut f = StepFeatures::from_step(out);
            f.prefill_tokens += step.spec.drafts.iter().map(|d| d.proposed).sum::<usize>() as f64;
            let target = step.elapsed.saturating_sub(step.spec.elapsed);
            let measured_ms = target.as_secs_f64() * 1e3;
            // Measured against predicted per step shape: what calibrates `brook simulate` to a
            // backend (issue 19: chunked prefill at long context is not linear on the GPU).
            tracing::debug!(
                measured_ms,
                predicted_ms = self.cost.predict_ms(&f),
                prefill_tokens = f.prefill_tokens,
                attn_pairs = f.prefill_attn_pairs,
                decode_seqs = f.decode_seqs,
                kv_tokens = f.kv_tokens_read,
                max_chunk = out
                    .scheduled
                    .iter()
                    .map(|s| s.num_tokens)
                    .max()
                    .unwrap_or(0),
                "step time"
            );
            self.cost.observe(&f, measured_ms);
            self.observe_spec_costs(out, step);
        }
        // Their blocks are back (the executor ran the step's copies): they compute from now.
        for id in &out.loading {
            if let Some(r) = self.requests.get_mut(id) {
                r.loading = false;
            }
        }
        let mut updates = Vec::with_capacity(out.num_sampled() + out.finished_early.len());
        updates.extend(
            out.finished_early
                .iter()
                .map(|&(id, reason)| RequestUpdate {
                    id,
                    new_token_ids: Vec::new(),
                    logprobs: Vec::new(),
                    finished: Some(reason),
                    num_computed_tokens: 0,
                    num_output_tokens: 0,
                }),
        );
        let mut tops = step.top_logprobs.iter();
        let mut any_finished = false;
        let mut at = 0;
        let mut drafts = step.spec.drafts.iter();
        let mut tokens = Vec::new();
        for s in &out.scheduled {
            tokens.clear();
            let mut logprobs = Vec::new();
            if s.sample {
                // Each sampling request's tokens are consecutive, in step order; looked up by
                // id if they are not where expected.
                let start = match step.sampled.get(at) {
                    Some(t) if t.request_id == s.id => at,
                    _ => step
                        .sampled
                        .iter()
                        .position(|t| t.request_id == s.id)
                        .unwrap_or(step.sampled.len()),
                };
                let run = &step.sampled[start..];
                let n = run.iter().take_while(|t| t.request_id == s.id).count();
                tokens.extend(run[..n].iter().map(|t| t.token));
                at = start + n;
                // Log-probabilities, for requests that asked: each token's own and its top
                // list (in the same order, among those requests only). Such requests get no
                // drafts (`SamplingParams::may_speculate`): one token each.
                let wants_logprobs =
                    (self.requests.get(&s.id)).is_some_and(|r| r.params.logprobs.is_some());
                for t in run[..n].iter().filter(|_| wants_logprobs) {
                    let top = match tops.next() {
                        Some(x) if x.request_id == s.id => Some(x),
                        _ => step.top_logprobs.iter().find(|x| x.request_id == s.id),
                    };
                    logprobs.push(TokenLogprobs {
                        token: t.token,
                        logprob: t.logprob,
                        top: top.map(|x| x.top.clone()).unwrap_or_default(),
                    });
                }
            }
            let outcome = match s.num_draft_tokens {
                0 => None,
                _ => drafts
                    .next()
                    .filter(|d| d.request_id == s.id)
                    .or_else(|| step.spec.drafts.iter().find(|d| d.request_id == s.id))
                    .copied(),
            };
            if let Some(u) = self.fold(s, &tokens, logprobs, outcome, kv, now, max_len) {
                any_finished |= u.finished.is_some();
                updates.push(u);
            }
        }
        if any_finished {
            let requests = &self.requests;
            self.running.retain(|id| requests.contains_key(id));
        }
        updates
    }

    /// One scheduled request's result (`tokens` when it sampled: its accepted drafts, then the
    /// target's token): its K/V computed, the tokens appended and checked one by one (nothing
    /// after one that ends the request), the request freed when it finished (the caller drops
    /// it from `running`). None with nothing to report: a prefill chunk, or a request that is
    /// gone or not in the state the step assumed.
    #[allow(clippy::too_many_arguments)]
    fn fold(
        &mut self,
        s: &ScheduledRequest,
        tokens: &[u32],
        mut logprobs: Vec<TokenLogprobs>,
        drafts: Option<DraftOutcome>,
        kv: &mut KvCacheManager,
        now: f64,
        max_len: usize,
    ) -> Option<RequestUpdate> {
        let id = s.id;
        let monitor_on = self.cfg.policy == Policy::Adaptive && self.cfg.emergency.enabled;
        let req = self.requests.get(&id)?;
        if req.status != Status::Running || req.loading || req.num_computed != s.num_computed_tokens
        {
            return None;
        }
        if let Some(d) = &drafts {
            self.observe_drafts(d);
        }
        let req = self.requests.get_mut(&id)?;
        req.num_computed = s.num_computed_tokens + s.num_tokens;
        let mut new_token_ids = Vec::new();
        let mut finished = None;
        match (s.sample, tokens.is_empty()) {
            (false, _) => {}
            (true, false) => {
                // Beyond the known token, one accepted draft per token after the first.
                let accepted = tokens.len() - 1;
                debug_assert!(
                    accepted <= s.num_draft_tokens,
                    "{id}: more tokens than drafts"
                );
                for &t in &tokens[..tokens.len().min(s.num_draft_tokens + 1)] {
                    req.tokens.push(t);
                    new_token_ids.push(t);
                    finished = req.check_stop(max_len);
                    if finished.is_some() {
                        break;
                    }
                }
                req.num_computed += new_token_ids.len() - 1;
                if monitor_on {
                    // The ITL SLO is on a request's mean gap (what the ITL guard keeps and the
                    // attainment counts), so the monitor watches each request's mean so far,
                    // not single gaps, which the guard lets run long where slack was banked.
                    let (metric, value_ms) = match req.first_token_at {
                        None => (SloMetric::Ttft, (now - req.arrival) * 1e3),
                        Some(first) => {
                            let gaps = req.num_output_tokens().saturating_sub(1).max(1);
                            (SloMetric::Itl, (now - first) * 1e3 / gaps as f64)
                        }
                    };
                    self.monitor.record(req.class, metric, now, value_ms);
                }
                req.first_token_at.get_or_insert(now);
                req.last_token_at = Some(now);
            }
            (true, true) => {
                // A backend bug; recomputing the last position next step resamples it.
                tracing::warn!(%id, "backend returned no token for a sampled sequence");
                req.num_computed -= 1;
            }
        }
        // Only verified tokens: drafts were never in `req.tokens`.
        kv.cache_computed_blocks(id, &req.tokens, req.num_computed);
        if s.num_draft_tokens > 0 && finished.is_none() {
            self.release_rejected(id, kv);
        }
        let req = self.requests.get_mut(&id)?;
        if new_token_ids.is_empty() && finished.is_none() {
            return None;
        }
        let update = RequestUpdate {
            id,
            // One per token kept (none past a token that ended the request).
            logprobs: {
                logprobs.truncate(new_token_ids.len());
                logprobs
            },
            new_token_ids,
            finished,
            num_computed_tokens: req.num_computed,
            num_output_tokens: req.num_output_tokens(),
        };
        if finished.is_some() {
            let n = req.num_output_tokens() as f64;
            self.mean_output += OUTPUT_EMA_ALPHA * (n - self.mean_output);
            self.num_output_samples += 1;
            self.requests.remove(&id);
            kv.free(id);
            self.executor_drops.push(id);
        }
        Some(update)
    }
}
