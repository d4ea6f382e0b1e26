//! The `fcfs` policy: one token budget; the running requests in order (a decode or the next
//! prompt chunk each, preempting from the back when blocks run out), then the waiting queue in
//! arrival order while `max_num_seqs` allows. See the module docs of `core`.

use super::{Scheduler, StepPlan};
use crate::kv::KvCacheManager;

impl Scheduler {
    pub(super) fn schedule_fcfs(&mut self, plan: &mut StepPlan, kv: &mut KvCacheManager) {
        self.schedule_running(plan, kv);
        // As in vLLM: memory was short enough to preempt, so admit nothing new this step.
        if plan.preempted.is_empty() {
            self.schedule_waiting(plan, kv);
        }
    }

    /// Each running request's next tokens (a decode with its draft positions, when it
    /// speculates and they fit); preempts from the back when blocks run out.
    fn schedule_running(&mut self, plan: &mut StepPlan, kv: &mut KvCacheManager) {
        let max_len = self.max_len(kv);
        let mut i = 0;
        'running: while i < self.running.len() && plan.budget > 0 {
            let id = self.running[i];
            let req = &self.requests[&id];
            let num_computed = req.num_computed;
            let is_decode = req.num_uncomputed() == 1;
            let num_new = self.chunk_size(req.num_schedulable(), plan.budget);
            if num_new == 0 {
                i += 1;
                continue;
            }
            let mut drafts = if is_decode {
                self.draft_depth(id, plan.budget, max_len)
            } else {
                0
            };
            // Drafts never preempt anyone: without room for them the decode runs alone.
            if drafts > 0 && kv.allocate_slots(id, num_computed, 1 + drafts).is_none() {
                drafts = 0;
            }
            while drafts == 0 && kv.allocate_slots(id, num_computed, num_new).is_none() {
                // Victims come from the back, behind `i`, so nothing scheduled so far is undone.
                let victim = self.running.pop().expect("running holds at least `id`");
                self.preempt(victim, kv);
                plan.preempted.push(victim);
                if victim == id {
                    break 'running;
                }
            }
            plan.push(id, num_new, drafts);
            i += 1;
        }
    }

    /// Waiting requests in order while budget, sequence slots and blocks last; never preempts.
    /// A swapped request, or one whose prefix hit reaches into the host tier, takes its slot
    /// and blocks now and computes from the next step (`loading`).
    fn schedule_waiting(&mut self, plan: &mut StepPlan, kv: &mut KvCacheManager) {
        let max_len = self.max_len(kv);
        while plan.budget > 0 && self.slots_used() < self.cfg.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            if self.drop_unschedulable(id, max_len, plan, kv) {
                continue;
            }
            if self.slots_used() + self.requests[&id].slots() > self.cfg.max_num_seqs {
                break;
            }
            if self.requests[&id].swapped_computed.is_some() {
                if !self.resume_swapped(id, plan, kv) {
                    break;
                }
                self.waiting.pop_front();
                continue;
            }
            let num_computed = self.lookup_prefix(id, kv);
            if kv.num_host_hit_blocks(id) > 0 {
                if !self.admit_loading(id, num_computed, plan, kv) {
                    break;
                }
                self.waiting.pop_front();
                continue;
            }
            let req = &self.requests[&id];
            let num_new = self.chunk_size(req.compute_target() - num_computed, plan.budget);
            if kv.allocate_slots(id, num_computed, num_new).is_none() {
                break;
            }
            self.waiting.pop_front();
            self.start_running(id, num_computed, plan);
            plan.push(id, num_new, 0);
        }
    }
}
