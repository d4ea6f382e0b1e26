//! Admission (both policies): `add_request`, and whether a new request is refused as
//! `overloaded` and the `retry_after_ms` it is told. A bounded waiting queue (requests, prompt tokens); with
//! `adaptive` and `early_reject`, lower bounds of its TTFT (`ttft_unreachable`, `slot_wait`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::estimates::prefill_ms_with;
use super::Scheduler;
use crate::request::RequestId;
use crate::sampling::sampler::sample_seed;
use crate::scheduler::admission::Admission;
use crate::scheduler::admission::OverloadReason;
use crate::scheduler::request::{NewRequest, Request};
use crate::scheduler::{Policy, RequestClass};

impl Scheduler {
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
        if req.n > 1 && req.prompt_token_ids.len() < 2 {
            // No prompt block to share before the last token: the choices run as they are
            // (independent requests, so they may speculate).
            for i in 0..req.n {
                let choice = NewRequest {
                    id: RequestId(req.id.0 + i as u64),
                    seed: sample_seed(req.seed, i),
                    n: 1,
                    ..req.clone()
                };
                let choice_id = choice.id;
                self.waiting.push_back(choice_id);
                let spec = self.spec_for_new(choice.params.may_speculate());
                let mut request = Request::new(choice, class, now);
                request.spec = spec;
                self.requests.insert(choice_id, request);
            }
            return Admission::Accepted;
        }
        let request_id = req.id;
        self.waiting.push_back(req.id);
        // Choices forked off one prompt (n > 1) share its blocks copy-on-write, which draft
        // positions and their rollback do not take into account: they decode without drafts.
        let spec = self.spec_for_new(req.params.may_speculate() && req.n <= 1);
        let mut request = Request::new(req, class, now);
        request.spec = spec;
        self.requests.insert(request_id, request);
        Admission::Accepted
    }

    pub(super) fn overload(
        &self,
        prompt_tokens: usize,
        class: RequestClass,
    ) -> Option<OverloadReason> {
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
            // own prefill, each step as large as the lane allows and nothing else running, at
            // the cheaper of the fitted and the prior step costs.
            let ahead: usize = self
                .waiting
                .iter()
                .map(|id| &self.requests[id])
                .filter(|r| r.class <= class)
                .map(|r| r.num_tokens())
                .sum();
            let own_budget = self.prefill_budget(class);
            let c = self.optimistic_coefficients();
            let own_ms = prefill_ms_with(&c, prompt_tokens, own_budget);
            let bound_ms = prefill_ms_with(&c, ahead, self.cfg.max_num_batched_tokens)
                + own_ms
                + c.per_prefill_attn_pair_ms * (prompt_tokens * prompt_tokens) as f64 / 2.0;
            let slo_ms = self.cfg.slo.of(class).ttft_ms;
            if bound_ms > slo_ms {
                return Some(OverloadReason::TtftUnreachable);
            }
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
        let free = self.cfg.max_num_seqs.saturating_sub(self.slots_used());
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

    /// Time to prefill what waits now: when a retry could find room.
    pub(super) fn retry_after_ms(&self) -> u64 {
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
}
