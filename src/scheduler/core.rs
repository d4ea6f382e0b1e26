//! The scheduling loop: one token budget per step, running requests first, then admissions.
//!
//! Each step walks the running requests in order; each gets the tokens it has not computed yet
//! (1 for a decode, a chunk for a prompt still prefilling), capped by the remaining budget and by
//! `long_prefill_token_threshold`. In FCFS order this serves decodes first: a prompt chunk only
//! leaves budget to the requests behind it when it is its last chunk or capped. When blocks run
//! out, the lowest-priority running request (the last) is preempted by recompute and the
//! allocation retried. The rest of the budget goes to waiting requests, FCFS, as prefix-cache
//! hits plus a chunk of prompt, while `max_num_seqs` allows; those never preempt.
//!
//! Contract with the caller: one step at a time. Every `SchedulerOutput` goes to
//! `update_from_output` (with a default `StepOutput` when the batch was empty) before the next
//! `schedule`. Aborts and finishes may come at any time; a step's results for a request that is
//! gone are dropped.

use std::collections::{HashMap, VecDeque};

use crate::executor::batch::{BatchInput, SampleInput, SeqInput, StepOutput};
use crate::kv::KvCacheManager;
use crate::request::{FinishReason, RequestId};
use crate::scheduler::output::{RequestUpdate, SchedulerOutput};
use crate::scheduler::request::{NewRequest, Request, Status};
use crate::scheduler::SchedulerConfig;

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    requests: HashMap<RequestId, Request>,
    /// FCFS; preempted requests re-enter at the front.
    waiting: VecDeque<RequestId>,
    /// In priority order: the last one is preempted first.
    running: Vec<RequestId>,
    num_preemptions: u64,
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
            cfg,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Queues a request at the back of the waiting queue. Returns false (and ignores it) when a
    /// request with this id is already known.
    pub fn add_request(&mut self, req: NewRequest) -> bool {
        if self.requests.contains_key(&req.id) {
            return false;
        }
        self.waiting.push_back(req.id);
        self.requests.insert(req.id, Request::new(req));
        true
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

    /// Preemptions since start (a metric counter).
    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    /// Plans the next step. See the module docs for the policy.
    pub fn schedule(&mut self, kv: &mut KvCacheManager) -> SchedulerOutput {
        let mut plan = StepPlan {
            budget: self.cfg.max_num_batched_tokens,
            scheduled: Vec::with_capacity(self.running.len() + 1),
            preempted: Vec::new(),
            admitted: Vec::new(),
            finished_early: Vec::new(),
        };
        self.schedule_running(&mut plan, kv);
        // As in vLLM: memory was short enough to preempt, so admit nothing new this step.
        if plan.preempted.is_empty() {
            self.schedule_waiting(&mut plan, kv);
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
        self.num_preemptions += 1;
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
    pub fn update_from_output(
        &mut self,
        out: &SchedulerOutput,
        step: &StepOutput,
        kv: &mut KvCacheManager,
    ) -> Vec<RequestUpdate> {
        let max_len = self.max_len(kv);
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
