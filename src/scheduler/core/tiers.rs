//! The KV memory tier in the scheduler (both policies): preemption by swap or recompute, chosen
//! per request by cost; swapped requests resuming; prefix hits in the host tier; and the fork of
//! parallel-sampling requests (`n > 1`). See the module docs of `core` and `kv::manager`.

use super::{Scheduler, StepPlan};
use crate::kv::KvCacheManager;
use crate::request::RequestId;
use crate::sampling::sampler::sample_seed;
use crate::scheduler::request::{Request, Status};
use crate::scheduler::swap::{PreemptDecision, PreemptionMode};

impl Scheduler {
    /// Sequence slots taken: running requests and the choices they will fork.
    pub(super) fn slots_used(&self) -> usize {
        self.running.len() + self.fork_reserved
    }

    /// Preempts a running request (the caller took it out of `running`): its blocks go to the
    /// host tier (it resumes where it stopped) or back to the pool (full ones stay cached, so a
    /// resume often hits them, in either tier) and it waits at the front to recompute.
    pub(super) fn preempt(&mut self, id: RequestId, kv: &mut KvCacheManager) {
        let decision = self.preemption_decision(id, kv);
        self.preempt_as(id, kv, decision);
    }

    /// [`Scheduler::preempt`] with the decision made (a swap falls back to recompute when the
    /// host tier cannot take it).
    pub(super) fn preempt_as(
        &mut self,
        id: RequestId,
        kv: &mut KvCacheManager,
        decision: PreemptDecision,
    ) {
        let swapped = decision == PreemptDecision::Swap && kv.swap_out(id);
        if !swapped {
            kv.free(id);
        }
        let req = self
            .requests
            .get_mut(&id)
            .expect("running requests are known");
        req.swapped_computed = swapped.then_some(req.num_computed);
        req.num_computed = 0;
        req.status = Status::Waiting;
        req.executor_blocks = None;
        req.executor_cut = false;
        req.loading = false;
        self.fork_reserved -= req.pending_fork;
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
        self.stats.preempt_decisions[decision.index()] += 1;
        tracing::debug!(%id, decision = decision.as_str(), "preempted");
    }

    /// Swap or recompute: the copies out and back at the tier's bandwidth against the cost
    /// model's prefill time for what the request had computed (its linear part and its
    /// attention pairs). A host tier without room means recompute, never a failure.
    fn preemption_decision(&self, id: RequestId, kv: &KvCacheManager) -> PreemptDecision {
        let Some(cost) = self.swap_cost.filter(|_| kv.has_host_tier()) else {
            return PreemptDecision::RecomputeNoHost;
        };
        if self.cfg.preemption_mode == PreemptionMode::Recompute {
            return PreemptDecision::Recompute;
        }
        let req = &self.requests[&id];
        if req.num_computed == 0 {
            return PreemptDecision::Recompute; // nothing to keep
        }
        let Some((out, back)) = kv.swap_out_plan(id) else {
            return PreemptDecision::RecomputeHostFull;
        };
        if self.cfg.preemption_mode == PreemptionMode::Swap {
            return PreemptDecision::Swap;
        }
        let swap_ms = cost.copy_ms(out + back);
        let recompute_ms = self.recompute_ms(req);
        if swap_ms < recompute_ms {
            PreemptDecision::Swap
        } else {
            PreemptDecision::Recompute
        }
    }

    /// The cost model's time to prefill `req`'s computed tokens again.
    fn recompute_ms(&self, req: &Request) -> f64 {
        let n = req.num_computed;
        let c = self.cost.coefficients();
        self.prefill_ms(n, self.prefill_budget(req.class))
            + c.per_prefill_attn_pair_ms * (n * n) as f64 / 2.0
    }

    /// A waiting request's cached prefix, for admission: the lookup in both tiers, kept short of
    /// the fork point of an `n > 1` request (its prefill must end one token before its prompt
    /// does), and without the host-tier part when copying it back costs more than computing it.
    pub(super) fn lookup_prefix(&mut self, id: RequestId, kv: &mut KvCacheManager) -> usize {
        let req = &self.requests[&id];
        let mut hit = kv.get_computed_blocks(id, &req.tokens);
        if req.pending_fork > 0 && hit + 1 >= req.compute_target() {
            hit = kv.limit_hits(id, req.compute_target().saturating_sub(1));
        }
        let host_blocks = kv.num_host_hit_blocks(id);
        if host_blocks > 0 {
            let tokens = host_blocks * kv.block_size();
            let copy_ms = self
                .swap_cost
                .map_or(f64::INFINITY, |c| c.copy_ms(host_blocks));
            let c = self.cost.coefficients();
            // The linear part alone: the hit's attention pairs make computing dearer still.
            if copy_ms > tokens as f64 * c.per_prefill_token_ms {
                hit = kv.drop_host_hits(id);
            }
        }
        hit
    }

    /// Admits a waiting request whose prefix hit includes host-tier blocks: it takes its hit
    /// blocks (copies planned) and its slot, and computes from the next step. False when the
    /// blocks do not fit.
    pub(super) fn admit_loading(
        &mut self,
        id: RequestId,
        num_computed: usize,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
    ) -> bool {
        if kv.allocate_slots(id, num_computed, 0).is_none() {
            return false;
        }
        self.start_running(id, num_computed, plan);
        self.set_loading(id);
        true
    }

    /// Brings a swapped request back (its blocks, copies planned): it computes from the next
    /// step, where it stopped. False when its blocks do not fit.
    pub(super) fn resume_swapped(
        &mut self,
        id: RequestId,
        plan: &mut StepPlan,
        kv: &mut KvCacheManager,
    ) -> bool {
        if !kv.swap_in(id) {
            return false;
        }
        let req = self
            .requests
            .get_mut(&id)
            .expect("waiting requests are known");
        let computed = req.swapped_computed.take().expect("it was swapped");
        self.start_running(id, computed, plan);
        self.set_loading(id);
        true
    }

    fn set_loading(&mut self, id: RequestId) {
        let req = self.requests.get_mut(&id).expect("known");
        req.loading = true;
        self.loading.push(id);
    }

    /// Forks every running `n > 1` request that has computed its prompt but the last token:
    /// its choices `id + 1 ..` take its blocks (shared, copy-on-write) and its state, each with
    /// its own sampling stream, and every choice computes the last prompt token itself. The
    /// executor gets the parent again as new: copy-on-write may change its table.
    pub(super) fn fork_due(&mut self, kv: &mut KvCacheManager) {
        let due: Vec<RequestId> = self
            .running
            .iter()
            .copied()
            .filter(|id| {
                let r = &self.requests[id];
                r.pending_fork > 0 && !r.loading && r.num_computed + 1 == r.num_tokens()
            })
            .collect();
        for id in due {
            let parent = self
                .requests
                .get_mut(&id)
                .expect("running requests are known");
            let n = std::mem::take(&mut parent.pending_fork);
            self.fork_reserved -= n;
            if parent.executor_blocks.take().is_some() {
                self.executor_drops.push(id);
            }
            let parent = &self.requests[&id];
            let children: Vec<(RequestId, Request)> = (1..=n)
                .map(|i| {
                    let child = RequestId(id.0 + i as u64);
                    (child, parent.fork(sample_seed(parent.seed, i)))
                })
                .collect();
            for (child, req) in children {
                kv.fork(id, child);
                let old = self.requests.insert(child, req);
                debug_assert!(old.is_none(), "{child}: choice id taken");
                self.running.push(child);
            }
            tracing::debug!(%id, children = n, "forked");
        }
    }
}
