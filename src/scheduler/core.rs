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
//! Time: every call that needs it takes `now`, seconds on the caller's clock (any fixed epoch).
//!
//! Contract with the caller: one step at a time. Every `SchedulerOutput` goes to
//! `update_from_output` (with a default `StepOutput` when the batch was empty) before the next
//! `schedule`. Aborts and finishes may come at any time; a step's results for a request that is
//! gone are dropped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

use crate::kv::KvCacheManager;
use crate::request::{FinishReason, RequestId};
use crate::scheduler::admission::{Admission, OverloadReason};
use crate::scheduler::cost_model::{CostModel, StepFeatures};
use crate::scheduler::policy::{
    should_merge, Candidate, Lane, MergeContext, MergeReason, StepDraft,
};
use crate::scheduler::request::{NewRequest, Request, Status};
use crate::scheduler::slo::{EmergencyTransition, SloMetric, SloMonitor};
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

    fn overload(&self, prompt_tokens: usize, class: RequestClass) -> Option<OverloadReason> {
        let a = &self.cfg.admission;
        if self.waiting.len() >= a.max_waiting_requests {
            return Some(OverloadReason::QueueRequests);
        }
        let queued: usize = self
            .waiting
            .iter()
            .map(|id| self.requests[id].num_tokens())
            .sum();
        if queued + prompt_tokens > a.max_waiting_prompt_tokens {
            return Some(OverloadReason::QueueTokens);
        }
        if self.cfg.policy == Policy::Adaptive && a.early_reject {
            // Lower bound: the prompts ahead of it in the lanes served before its own, then its
            // own prefill, each step as large as the lane allows and nothing else running.
            let ahead: usize = self
                .waiting
                .iter()
                .map(|id| &self.requests[id])
                .filter(|r| r.class <= class)
                .map(|r| r.num_tokens())
                .sum();
            let own_budget = match class {
                RequestClass::Long => self.cfg.classes.long_prefill_budget,
                _ => self.cfg.max_num_batched_tokens,
            };
            let c = self.cost.coefficients();
            let bound_ms = self.prefill_ms(ahead, self.cfg.max_num_batched_tokens)
                + self.prefill_ms(prompt_tokens, own_budget)
                + c.per_prefill_attn_pair_ms * (prompt_tokens * prompt_tokens) as f64 / 2.0;
            let slo_ms = self.cfg.slo.of(class).ttft_ms;
            if bound_ms > slo_ms {
                return Some(OverloadReason::TtftUnreachable);
            }
            let own_ms = self.prefill_ms(prompt_tokens, own_budget);
            if self.slot_wait_ms(class) + own_ms > slo_ms {
                return Some(OverloadReason::SlotWait);
            }
        }
        None
    }

    /// Lower bound of how long a new request of `class` waits for a sequence slot: replays the
    /// slot releases, each running request holding its slot for the steps it must still run
    /// (`Request::min_remaining_output`), the waiting requests served before it (its lane and
    /// the lanes ahead) taking the free and the first freed slots in order and holding them as
    /// long, each step costing at least a decode step of the running set. Zero with a slot to
    /// spare.
    fn slot_wait_ms(&self, class: RequestClass) -> f64 {
        let ahead = self
            .waiting
            .iter()
            .map(|id| &self.requests[id])
            .filter(|r| r.class <= class || r.num_output_tokens() > 0)
            .filter(|r| !(r.paused && self.monitor.in_emergency()));
        let free = self.cfg.max_num_seqs.saturating_sub(self.running.len());
        if ahead.clone().count() < free {
            return 0.0;
        }
        // Min-heap of the steps at which each slot frees.
        let mut releases: BinaryHeap<Reverse<usize>> = self
            .running
            .iter()
            .map(|id| Reverse(self.requests[id].min_remaining_output(self.max_len_seen)))
            .chain(std::iter::repeat_n(Reverse(0), free))
            .collect();
        for r in ahead {
            let Some(Reverse(at)) = releases.pop() else {
                return 0.0; // max_num_seqs is 0: validated away
            };
            releases.push(Reverse(at + r.min_remaining_output(self.max_len_seen)));
        }
        let Some(&Reverse(steps)) = releases.peek() else {
            return 0.0;
        };
        steps as f64 * self.decode_step_ms()
    }

    /// Linear part of prefilling `tokens` in steps of at most `per_step` tokens.
    fn prefill_ms(&self, tokens: usize, per_step: usize) -> f64 {
        let c = self.cost.coefficients();
        tokens.div_ceil(per_step.max(1)) as f64 * c.base_ms + tokens as f64 * c.per_prefill_token_ms
    }

    /// Time to prefill what waits now: when a retry could find room.
    fn retry_after_ms(&self) -> u64 {
        let queued: usize = self
            .waiting
            .iter()
            .map(|id| self.requests[id].num_tokens())
            .sum();
        let a = &self.cfg.admission;
        let ms = self
            .prefill_ms(queued, self.cfg.max_num_batched_tokens)
            .ceil() as u64;
        ms.clamp(a.min_retry_after_ms, a.max_retry_after_ms)
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
            Policy::Fcfs => {
                self.schedule_running(&mut plan, kv);
                // As in vLLM: memory was short enough to preempt, so admit nothing new this step.
                if plan.preempted.is_empty() {
                    self.schedule_waiting(&mut plan, kv);
                }
            }
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

    fn schedule_running(&mut self, plan: &mut StepPlan, kv: &mut KvCacheManager) {
        let mut i = 0;
        'running: while i < self.running.len() && plan.budget > 0 {
            let id = self.running[i];
            let req = &self.requests[&id];
            let num_computed = req.num_computed;
            let num_new = self.chunk_size(req.num_uncomputed(), plan.budget);
            if num_new == 0 {
                i += 1;
                continue;
            }
            while kv.allocate_slots(id, num_computed, num_new).is_none() {
                // Victims come from the back, behind `i`, so nothing scheduled so far is undone.
                let victim = self.running.pop().expect("running holds at least `id`");
                self.preempt(victim, kv);
                plan.preempted.push(victim);
                if victim == id {
                    break 'running;
                }
            }
            plan.scheduled.push((id, num_new));
            plan.budget -= num_new;
            i += 1;
        }
    }

    fn schedule_waiting(&mut self, plan: &mut StepPlan, kv: &mut KvCacheManager) {
        let max_len = self.max_len(kv);
        while plan.budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let req = &self.requests[&id];
            // The session rejects such prompts before; this keeps a slip from wedging the queue.
            if req.tokens.is_empty()
                || req.num_tokens() > max_len
                || req.num_output_tokens() >= req.params.max_tokens
            {
                self.waiting.pop_front();
                self.requests.remove(&id);
                kv.free(id);
                plan.finished_early.push((id, FinishReason::Length));
                continue;
            }
            let num_computed = kv.get_computed_blocks(id, &req.tokens);
            let num_new = self.chunk_size(req.num_tokens() - num_computed, plan.budget);
            if kv.allocate_slots(id, num_computed, num_new).is_none() {
                break;
            }
            self.waiting.pop_front();
            self.running.push(id);
            let req = self
                .requests
                .get_mut(&id)
                .expect("front of waiting is known");
            req.num_computed = num_computed;
            req.status = Status::Running;
            if !req.ever_scheduled {
                req.ever_scheduled = true;
                plan.admitted.push(id);
            }
            plan.scheduled.push((id, num_new));
            plan.budget -= num_new;
        }
    }

    /// Evaluates the SLO monitor; on entering emergency mode, pauses the long sequences.
    fn update_emergency(&mut self, plan: &mut StepPlan, kv: &mut KvCacheManager, now: f64) {
        match self.monitor.evaluate(now) {
            Some(EmergencyTransition::Entered {
                class,
                metric,
                p95_ms,
                slo_ms,
            }) => {
                self.stats.count_breach(class, metric);
                tracing::debug!(
                    class = class.as_str(),
                    metric = metric.as_str(),
                    p95_ms,
                    slo_ms,
                    "emergency mode entered"
                );
                self.pause_long_sequences(plan, kv, class, now);
            }
            Some(EmergencyTransition::Left) => {
                self.stats.emergency_exits += 1;
                for req in self.requests.values_mut() {
                    req.paused = false;
                }
                tracing::debug!("emergency mode left");
            }
            None => {}
        }
    }

    /// Pauses (preempts, their full blocks staying in the prefix cache) the running sequences
    /// longer than `pause_length_factor` × the running batch's mean length, once each. A pause
    /// frees memory and step time for the others, so it spares the class whose SLO broke: pausing
    /// it would only deepen its own breach. It also spares a sequence the pause alone would make
    /// miss its own SLO (`pause_breaks_own_slo`): trading one request's SLO for the others' is
    /// no gain when each counts the same.
    fn pause_long_sequences(
        &mut self,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
        breached: RequestClass,
        now: f64,
    ) {
        if self.running.is_empty() {
            return;
        }
        let total: usize = self
            .running
            .iter()
            .map(|id| self.requests[id].num_tokens())
            .sum();
        let limit =
            self.cfg.emergency.pause_length_factor * total as f64 / self.running.len() as f64;
        let step_ms = self.decode_step_ms();
        let mut victims = Vec::new();
        for &id in &self.running {
            let r = &self.requests[&id];
            if r.num_tokens() as f64 <= limit || r.was_paused || r.class == breached {
                continue;
            }
            if self.pause_breaks_own_slo(r, now, step_ms) {
                self.stats.emergency_pauses_spared += 1;
                tracing::debug!(%id, tokens = r.num_tokens(), "spared by emergency mode");
                continue;
            }
            victims.push(id);
        }
        for id in victims {
            self.running.retain(|&r| r != id);
            self.preempt(id, kv);
            let req = self
                .requests
                .get_mut(&id)
                .expect("running requests are known");
            req.paused = true;
            req.was_paused = true;
            plan.preempted.push(id);
            self.stats.emergency_pauses += 1;
            tracing::debug!(%id, tokens = req.num_tokens(), "paused by emergency mode");
        }
    }

    /// Whether pausing `r` at `now` would by itself make it miss its SLO. A pause lasts at least
    /// `exit_hold_s` (emergency mode holds that long once calm), then it recomputes what it has
    /// and, if it has started, generates the output expected of it at `step_ms` a token: the
    /// TTFT it would reach, or else the mean ITL, against its class's SLO.
    fn pause_breaks_own_slo(&self, r: &Request, now: f64, step_ms: f64) -> bool {
        let slo = self.cfg.slo.of(r.class);
        let per_step = match r.class {
            RequestClass::Long => self.cfg.classes.long_prefill_budget,
            _ => self.cfg.max_num_batched_tokens,
        };
        let delay_ms =
            self.cfg.emergency.exit_hold_s * 1e3 + self.prefill_ms(r.num_tokens(), per_step);
        let Some(first) = r.first_token_at else {
            return (now - r.arrival) * 1e3 + delay_ms > slo.ttft_ms;
        };
        let remaining = self.expected_remaining_output(r);
        let gaps = (r.num_output_tokens() + remaining).saturating_sub(1).max(1);
        let decode_ms = (now - first) * 1e3 + delay_ms + remaining as f64 * step_ms;
        decode_ms / gaps as f64 > slo.itl_ms
    }

    /// Predicted time of a step that decodes every running request once.
    fn decode_step_ms(&self) -> f64 {
        let mut step = StepFeatures::default();
        for id in &self.running {
            step.add_seq(1, self.requests[id].num_computed + 1);
        }
        self.cost.predict_ms(&step)
    }

    /// The adaptive step: every decode, then prefill candidates lane by lane through
    /// `should_merge`.
    fn schedule_adaptive(&mut self, plan: &mut StepPlan, kv: &mut KvCacheManager, now: f64) {
        let mut draft = StepDraft::new();
        let mut in_step: HashSet<RequestId> = HashSet::with_capacity(self.running.len() + 8);
        let paused_before = plan.preempted.len();
        self.schedule_decodes(plan, kv, &mut draft, &mut in_step);
        // Preempted for memory: admit nothing new this step (pauses freed memory on purpose).
        let admit = plan.preempted.len() == paused_before;

        // Candidates by lane; within a lane, running (older) before waiting, each in order.
        // Slot 0 holds medium and long requests promoted for their own TTFT deadline.
        let mut lanes: [Vec<(RequestId, bool)>; 5] = Default::default();
        let lane_slot = |lane: Lane| match lane {
            Lane::FastLane => 1,
            Lane::Resumed => 2,
            Lane::Normal => 3,
            Lane::LongStream | Lane::Decode => 4,
        };
        for &id in &self.running {
            let r = &self.requests[&id];
            if r.num_uncomputed() > 1 {
                let lane = Lane::of_prefill(r.class);
                let slot = if self.overdue(r, now) {
                    0
                } else {
                    lane_slot(lane)
                };
                lanes[slot].push((id, true));
            }
        }
        if admit {
            // Paused requests wait while emergency mode lasts and others run; with nothing
            // running a pause frees nothing, and the engine must not idle with work queued.
            let hold_paused = self.monitor.in_emergency() && !self.running.is_empty();
            for &id in &self.waiting {
                let r = &self.requests[&id];
                if r.paused && hold_paused {
                    continue;
                }
                let slot = if r.num_output_tokens() > 0 {
                    lane_slot(Lane::Resumed)
                } else if self.overdue(r, now) {
                    0
                } else {
                    lane_slot(Lane::of_prefill(r.class))
                };
                lanes[slot].push((id, false));
            }
        }

        let bs = kv.block_size();
        let watermark = (self.cfg.merge.kv_watermark * kv.num_blocks() as f64).ceil();
        let reserved: usize = self
            .running
            .iter()
            .map(|id| self.expected_growth_blocks(*id, kv))
            .sum();
        let mut headroom = (kv.num_free_blocks() as f64 - watermark - reserved as f64).max(0.0)
            * self.cfg.merge.kv_threshold;
        let decode_only = draft;
        let mut short_slack_ms = f64::INFINITY;
        let mut long_left = self.cfg.classes.long_prefill_budget;
        let max_len = self.max_len(kv);
        let mut admitted_now: HashSet<RequestId> = HashSet::new();

        for (slot, lane_ids) in lanes.iter().enumerate() {
            for &(id, is_running) in lane_ids {
                if plan.budget == 0 {
                    self.stats.count_merge(MergeReason::TokenBudget);
                    break;
                }
                let req = &self.requests[&id];
                let lane = if slot == lane_slot(Lane::Resumed) {
                    Lane::Resumed
                } else {
                    Lane::of_prefill(req.class)
                };
                if !is_running
                    && (req.tokens.is_empty()
                        || req.num_tokens() > max_len
                        || req.num_output_tokens() >= req.params.max_tokens)
                {
                    // The session rejects such prompts before; this keeps a slip from wedging.
                    admitted_now.insert(id);
                    self.requests.remove(&id);
                    kv.free(id);
                    plan.finished_early.push((id, FinishReason::Length));
                    continue;
                }
                if lane == Lane::LongStream && long_left == 0 {
                    self.stats.count_merge(MergeReason::LongBudget);
                    // The promoted slot mixes classes: a medium request behind may still fit.
                    if slot == 0 {
                        continue;
                    }
                    break;
                }
                let num_computed = if is_running {
                    req.num_computed
                } else {
                    kv.get_computed_blocks(id, &req.tokens)
                };
                let uncomputed = req.num_tokens() - num_computed;
                let mut wanted = uncomputed;
                match lane {
                    Lane::FastLane | Lane::Decode => {}
                    Lane::Resumed | Lane::Normal => {
                        if self.cfg.long_prefill_token_threshold > 0 {
                            wanted = wanted.min(self.cfg.long_prefill_token_threshold);
                        }
                    }
                    Lane::LongStream => wanted = wanted.min(long_left),
                }
                // The fast lane admits a prompt whole, unless it exceeds the whole step budget
                // (a small budget with a large short_below): then it is chunked like the rest.
                let min_tokens =
                    if lane == Lane::FastLane && wanted <= self.cfg.max_num_batched_tokens {
                        wanted
                    } else {
                        // Never more than a whole step's budget, or nothing could ever fit.
                        wanted.min(
                            self.cfg
                                .merge
                                .min_chunk_tokens
                                .clamp(1, self.cfg.max_num_batched_tokens.max(1)),
                        )
                    };
                let kv_blocks_needed = if is_running {
                    0
                } else {
                    let growth = self.expected_remaining_output(req);
                    (req.num_tokens() + growth).div_ceil(bs) - num_computed / bs
                };
                let cand = Candidate {
                    lane,
                    num_computed,
                    wanted,
                    min_tokens,
                    kv_blocks_needed,
                };
                let ctx = MergeContext {
                    token_budget_left: plan.budget,
                    seq_available: is_running || self.running.len() < self.cfg.max_num_seqs,
                    kv_headroom_blocks: headroom,
                    running_is_empty: self.running.is_empty(),
                    short_ttft_slack_ms: if lane == Lane::FastLane {
                        f64::INFINITY
                    } else {
                        short_slack_ms
                    },
                };
                let mut decision = should_merge(&self.cost, &self.cfg.merge, &draft, &cand, &ctx);
                if decision.reason.merged()
                    && kv
                        .allocate_slots(id, num_computed, decision.tokens)
                        .is_none()
                {
                    decision.reason = MergeReason::KvAllocation;
                }
                self.stats.count_merge(decision.reason);
                tracing::debug!(
                    %id,
                    lane = lane.as_str(),
                    reason = decision.reason.as_str(),
                    wanted,
                    tokens = decision.tokens,
                    "merge decision"
                );
                if !decision.reason.merged() {
                    if lane == Lane::FastLane && !is_running {
                        // It waits for the next step: what this step may still add is bounded
                        // by its TTFT deadline, less its own prefill step after this one.
                        let mut alone = decode_only.features;
                        alone.add_seq(uncomputed, req.num_tokens());
                        let deadline_ms = (req.arrival - now) * 1e3 + self.cfg.slo.short.ttft_ms;
                        short_slack_ms =
                            short_slack_ms.min(deadline_ms - self.cost.predict_ms(&alone));
                    }
                    continue;
                }
                let tokens = decision.tokens;
                draft.add_prefill(num_computed, tokens);
                plan.scheduled.push((id, tokens));
                plan.budget -= tokens;
                in_step.insert(id);
                if lane == Lane::LongStream {
                    long_left = long_left.saturating_sub(tokens);
                }
                if !is_running {
                    headroom = (headroom - kv_blocks_needed as f64).max(0.0);
                    admitted_now.insert(id);
                    self.running.push(id);
                    let req = self.requests.get_mut(&id).expect("candidate is known");
                    req.num_computed = num_computed;
                    req.status = Status::Running;
                    if !req.ever_scheduled {
                        req.ever_scheduled = true;
                        plan.admitted.push(id);
                    }
                }
            }
        }
        if !admitted_now.is_empty() {
            self.waiting.retain(|id| !admitted_now.contains(id));
        }
    }

    /// Allocates every decode's slot, preempting the lowest-priority running request not yet in
    /// the step when blocks run out.
    fn schedule_decodes(
        &mut self,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
        draft: &mut StepDraft,
        in_step: &mut HashSet<RequestId>,
    ) {
        let decodes: Vec<RequestId> = self
            .running
            .iter()
            .copied()
            .filter(|id| self.requests[id].num_uncomputed() == 1)
            .collect();
        for id in decodes {
            if plan.budget == 0 {
                self.stats.count_merge(MergeReason::TokenBudget);
                break;
            }
            if self.requests[&id].status != Status::Running {
                continue; // preempted as a victim of an earlier decode
            }
            let num_computed = self.requests[&id].num_computed;
            let mut fits = true;
            while kv.allocate_slots(id, num_computed, 1).is_none() {
                let victim = self.pick_victim(in_step).unwrap_or(id);
                self.running.retain(|&r| r != victim);
                self.preempt(victim, kv);
                plan.preempted.push(victim);
                if victim == id {
                    fits = false;
                    break;
                }
            }
            if !fits {
                continue;
            }
            let req = &self.requests[&id];
            let target = self.cfg.slo.of(req.class).itl_ms * self.cfg.merge.itl_headroom;
            draft.add_decode(num_computed + 1, target);
            plan.scheduled.push((id, 1));
            plan.budget -= 1;
            in_step.insert(id);
        }
    }

    /// The running request to preempt first: the longest class, then the latest admitted,
    /// among those not in the step yet.
    fn pick_victim(&self, in_step: &HashSet<RequestId>) -> Option<RequestId> {
        self.running
            .iter()
            .enumerate()
            .filter(|(_, id)| !in_step.contains(id))
            .max_by_key(|&(i, id)| (self.requests[id].class, i))
            .map(|(_, id)| *id)
    }

    /// Output tokens a request is still expected to generate.
    /// A medium or long request that has waited `merge.promote_after` of its TTFT SLO without a
    /// first token and can still meet it (adaptive): it goes ahead of the fast lane. One that can
    /// no longer make it is not promoted: serving lost causes first would make others late too.
    fn overdue(&self, req: &Request, now: f64) -> bool {
        if req.class == RequestClass::Short || req.num_output_tokens() > 0 {
            return false;
        }
        let slo_ms = self.cfg.slo.of(req.class).ttft_ms;
        let waited_ms = (now - req.arrival) * 1e3;
        if waited_ms < self.cfg.merge.promote_after * slo_ms {
            return false;
        }
        let per_step = match req.class {
            RequestClass::Long => self.cfg.classes.long_prefill_budget,
            _ => self.cfg.max_num_batched_tokens,
        };
        waited_ms + self.prefill_ms(req.num_uncomputed(), per_step) <= slo_ms
    }

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

    /// Tokens to compute for a request this step: all it has not computed, within the budget and
    /// the per-request prefill cap.
    fn chunk_size(&self, num_uncomputed: usize, budget: usize) -> usize {
        let mut n = num_uncomputed.min(budget);
        if self.cfg.long_prefill_token_threshold > 0 {
            n = n.min(self.cfg.long_prefill_token_threshold);
        }
        n
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
