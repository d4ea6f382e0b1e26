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
//! Files: this one holds the state, the public API and what both policies share (budgets,
//! preemption, building the step's output, folding results back); `fcfs.rs`, `adaptive.rs` and
//! `emergency.rs` hold one policy each, `overload.rs` admission control.
//!
//! Time: every call that needs it takes `now`, seconds on the caller's clock (any fixed epoch).
//!
//! Contract with the caller: one step at a time. Every `SchedulerOutput` goes to
//! `update_from_output` (with a default `StepOutput` when the batch was empty) before the next
//! `schedule`. Aborts and finishes may come at any time; a step's results for a request that is
//! gone are dropped.

mod adaptive;
mod emergency;
mod fcfs;
mod overload;

use std::collections::{HashMap, VecDeque};

use crate::kv::KvCacheManager;
use crate::request::{FinishReason, RequestId};
use crate::scheduler::admission::Admission;
use crate::scheduler::cost_model::{CostModel, StepFeatures};
use crate::scheduler::request::{NewRequest, Request, Status};
use crate::scheduler::slo::{SloMetric, SloMonitor};
use crate::scheduler::stats::SchedulerStats;
use crate::scheduler::{Policy, RequestClass, SchedulerConfig};
use crate::step::{BatchInput, RequestUpdate, SampleInput, SchedulerOutput, SeqInput, StepOutput};

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
}

/// A step under construction: the budget left and the decisions so far. Scheduling policies
/// (request classes, batch merging) extend this plan and the passes that fill it.
#[derive(Debug)]
struct StepPlan {
    budget: usize,
    scheduled: Vec<(RequestId, usize)>,
    preempted: Vec<RequestId>,
    admitted: Vec<RequestId>,
    finished_early: Vec<(RequestId, FinishReason)>,
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
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn classify(&self, prompt_tokens: usize) -> RequestClass {
        RequestClass::classify(prompt_tokens, &self.cfg.classes)
    }

    /// Admission control, then the back of the waiting queue. `now` is the request's arrival
    /// time (seconds, the caller's clock): TTFT is measured from it.
    pub fn add_request(&mut self, req: NewRequest, now: f64) -> Admission {
        if self.requests.contains_key(&req.id) {
            return Admission::Duplicate;
        }
        let class = self.classify(req.prompt_token_ids.len());
        if let Some(reason) = self.overload(req.prompt_token_ids.len(), class) {
            self.stats.overloaded[reason.index()] += 1;
            let retry_after_ms = self.retry_after_ms();
            tracing::debug!(
                id = %req.id,
                reason = reason.as_str(),
                retry_after_ms,
                "request refused"
            );
            return Admission::Overloaded {
                reason,
                retry_after_ms,
            };
        }
        self.stats.accepted[class.index()] += 1;
        self.waiting.push_back(req.id);
        self.requests.insert(req.id, Request::new(req, class, now));
        Admission::Accepted
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
            Status::Running => self.running.retain(|&r| r != id),
        }
        kv.free(id);
        tracing::debug!(%id, reason = reason.as_str(), "request finished outside a step");
        true
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

    /// Speculative-decoding depth to use now: the configured one, at most 1 in emergency mode.
    pub fn speculative_depth(&self) -> usize {
        if self.in_emergency() {
            self.cfg.speculative_depth.min(1)
        } else {
            self.cfg.speculative_depth
        }
    }

    /// Whether the actor should skip non-core metrics (emergency mode).
    pub fn non_core_metrics_suspended(&self) -> bool {
        self.in_emergency()
    }

    /// Output length a request is expected to reach: the observed mean once enough requests
    /// finished, the configured guess before.
    fn expected_output(&self) -> f64 {
        if self.num_output_samples >= MIN_OUTPUT_SAMPLES {
            self.mean_output
        } else {
            self.cfg.merge.expected_output_tokens as f64
        }
    }

    /// Plans the next step at time `now`. See the module docs for the policies.
    pub fn schedule(&mut self, kv: &mut KvCacheManager, now: f64) -> SchedulerOutput {
        self.max_len_seen = self.max_len(kv);
        let mut plan = StepPlan {
            budget: self.cfg.max_num_batched_tokens,
            scheduled: Vec::with_capacity(self.running.len() + 1),
            preempted: Vec::new(),
            admitted: Vec::new(),
            finished_early: Vec::new(),
        };
        match self.cfg.policy {
            Policy::Fcfs => self.schedule_fcfs(&mut plan, kv),
            Policy::Adaptive => {
                if self.cfg.emergency.enabled {
                    self.update_emergency(&mut plan, kv, now);
                }
                self.schedule_adaptive(&mut plan, kv, now);
            }
        }
        let out = self.build_output(plan, kv);
        tracing::debug!(
            seqs = out.batch.seqs.len(),
            tokens = out.batch.num_tokens(),
            prefill_tokens = out.num_prefill_tokens,
            decode_seqs = out.num_decode_seqs,
            preempted = out.preempted.len(),
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
        self.requests.remove(&id);
        kv.free(id);
        plan.finished_early.push((id, FinishReason::Length));
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

    /// Preemption by recompute: the blocks go back to the pool (full ones stay cached, so a
    /// resume often hits them), and the request waits at the front to recompute prompt and
    /// output so far.
    fn preempt(&mut self, id: RequestId, kv: &mut KvCacheManager) {
        kv.free(id);
        let req = self
            .requests
            .get_mut(&id)
            .expect("running requests are known");
        req.num_computed = 0;
        req.status = Status::Waiting;
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
    }

    /// A sequence may not outgrow the model's context, nor the whole KV pool (it could never
    /// be scheduled again).
    fn max_len(&self, kv: &KvCacheManager) -> usize {
        self.cfg
            .max_model_len
            .min(kv.num_blocks() * kv.block_size())
    }

    /// Linear part of prefilling `tokens` in steps of at most `per_step` tokens.
    fn prefill_ms(&self, tokens: usize, per_step: usize) -> f64 {
        let c = self.cost.coefficients();
        tokens.div_ceil(per_step.max(1)) as f64 * c.base_ms + tokens as f64 * c.per_prefill_token_ms
    }

    /// Predicted time of a step that decodes every running request once.
    fn decode_step_ms(&self) -> f64 {
        let mut step = StepFeatures::default();
        for id in &self.running {
            step.add_seq(1, self.requests[id].num_computed + 1);
        }
        self.cost.predict_ms(&step)
    }

    /// Output tokens a request is still expected to generate.
    fn expected_remaining_output(&self, req: &Request) -> usize {
        let left = req
            .params
            .max_tokens
            .saturating_sub(req.num_output_tokens());
        let expected =
            (self.expected_output().ceil() as usize).saturating_sub(req.num_output_tokens());
        left.min(expected)
    }

    /// Blocks a running request will still take: the rest of its prompt and its expected output.
    fn expected_growth_blocks(&self, id: RequestId, kv: &KvCacheManager) -> usize {
        let req = &self.requests[&id];
        let total = req.num_tokens() + self.expected_remaining_output(req);
        total
            .div_ceil(kv.block_size())
            .saturating_sub(kv.block_table(id).len())
    }

    fn build_output(&self, plan: StepPlan, kv: &KvCacheManager) -> SchedulerOutput {
        let bs = kv.block_size();
        let num_tokens: usize = plan.scheduled.iter().map(|&(_, n)| n).sum();
        let mut batch = BatchInput {
            token_ids: Vec::with_capacity(num_tokens),
            positions: Vec::with_capacity(num_tokens),
            slot_mapping: Vec::with_capacity(num_tokens),
            seqs: Vec::with_capacity(plan.scheduled.len()),
        };
        let (mut num_prefill_tokens, mut num_decode_seqs) = (0, 0);
        for &(id, num_new) in &plan.scheduled {
            let req = &self.requests[&id];
            let (start, end) = (req.num_computed, req.num_computed + num_new);
            let table = kv.block_table(id);
            batch.token_ids.extend_from_slice(&req.tokens[start..end]);
            for pos in start..end {
                batch.positions.push(pos as u32);
                batch
                    .slot_mapping
                    .push(table[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            let samples = end == req.num_tokens();
            if num_new == 1 && samples && req.num_output_tokens() > 0 {
                num_decode_seqs += 1;
            } else {
                num_prefill_tokens += num_new;
            }
            batch.seqs.push(SeqInput {
                request_id: id,
                query_len: num_new,
                context_len: end,
                block_table: table[..end.div_ceil(bs)].to_vec(),
                sample: samples.then(|| SampleInput {
                    params: req.params.clone(),
                    seed: req.seed,
                    output_index: req.num_output_tokens(),
                }),
            });
        }
        SchedulerOutput {
            batch,
            preempted: plan.preempted,
            admitted: plan.admitted,
            finished_early: plan.finished_early,
            num_prefill_tokens,
            num_decode_seqs,
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
        if !out.batch.seqs.is_empty() {
            let f = StepFeatures::from_batch(&out.batch);
            self.cost.observe(&f, step.elapsed.as_secs_f64() * 1e3);
        }
        let monitor_on = self.cfg.policy == Policy::Adaptive && self.cfg.emergency.enabled;
        let mut updates = Vec::with_capacity(out.batch.num_sampled() + out.finished_early.len());
        updates.extend(
            out.finished_early
                .iter()
                .map(|&(id, reason)| RequestUpdate {
                    id,
                    new_token_ids: Vec::new(),
                    finished: Some(reason),
                    num_computed_tokens: 0,
                    num_output_tokens: 0,
                }),
        );
        let mut sampled = step.sampled.iter();
        let mut any_finished = false;
        for seq in &out.batch.seqs {
            // Sampled tokens come in the order of the sampled seqs; look up by id if not.
            let token = seq.sample.as_ref().and_then(|_| match sampled.next() {
                Some(s) if s.request_id == seq.request_id => Some(s.token),
                _ => step
                    .sampled
                    .iter()
                    .find(|s| s.request_id == seq.request_id)
                    .map(|s| s.token),
            });
            let id = seq.request_id;
            // Gone (aborted or finished during the step) or not in the state this step assumed.
            let Some(req) = self.requests.get_mut(&id) else {
                continue;
            };
            if req.status != Status::Running || req.num_computed + seq.query_len != seq.context_len
            {
                continue;
            }
            req.num_computed = seq.context_len;
            let mut new_token_ids = Vec::new();
            let mut finished = None;
            match (seq.sample.is_some(), token) {
                (false, _) => {}
                (true, Some(t)) => {
                    req.tokens.push(t);
                    new_token_ids.push(t);
                    finished = req.check_stop(max_len);
                    if monitor_on {
                        let (metric, since) = match req.last_token_at {
                            None => (SloMetric::Ttft, req.arrival),
                            Some(last) => (SloMetric::Itl, last),
                        };
                        self.monitor
                            .record(req.class, metric, now, (now - since) * 1e3);
                    }
                    req.first_token_at.get_or_insert(now);
                    req.last_token_at = Some(now);
                }
                (true, None) => {
                    // A backend bug; recomputing the last position next step resamples it.
                    tracing::warn!(%id, "backend returned no token for a sampled sequence");
                    req.num_computed -= 1;
                }
            }
            kv.cache_computed_blocks(id, &req.tokens, req.num_computed);
            if new_token_ids.is_empty() && finished.is_none() {
                continue;
            }
            updates.push(RequestUpdate {
                id,
                new_token_ids,
                finished,
                num_computed_tokens: req.num_computed,
                num_output_tokens: req.num_output_tokens(),
            });
            if finished.is_some() {
                let n = req.num_output_tokens() as f64;
                self.mean_output += OUTPUT_EMA_ALPHA * (n - self.mean_output);
                self.num_output_samples += 1;
                self.requests.remove(&id);
                kv.free(id);
                any_finished = true;
            }
        }
        if any_finished {
            let requests = &self.requests;
            self.running.retain(|id| requests.contains_key(id));
        }
        updates
    }

    /// Queue and bookkeeping invariants, against the KV manager's tables.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self, kv: &KvCacheManager) -> Result<(), String> {
        if self.running.len() > self.cfg.max_num_seqs {
            return Err(format!("{} running > max_num_seqs", self.running.len()));
        }
        if self.running.len() + self.waiting.len() != self.requests.len() {
            return Err("queues and request map disagree".into());
        }
        for id in &self.waiting {
            let req = &self.requests[id];
            if req.status != Status::Waiting || req.num_computed != 0 {
                return Err(format!("{id}: waiting with status {:?}", req.status));
            }
            if !kv.block_table(*id).is_empty() {
                return Err(format!("{id}: waiting but holds blocks"));
            }
        }
        for id in &self.running {
            let req = &self.requests[id];
            if req.status != Status::Running {
                return Err(format!("{id}: running with status {:?}", req.status));
            }
            if kv.block_table(*id).len() * kv.block_size() < req.num_computed {
                return Err(format!("{id}: blocks do not cover its computed tokens"));
            }
        }
        Ok(())
    }
}
