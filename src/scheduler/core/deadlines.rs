//! Documents against their TTFT deadlines (adaptive policy, `merge.deadline_share`): which one
//! a step must pull, and what its remaining prefill is predicted to take.

use foldhash::HashSet;

use super::Scheduler;
use crate::request::RequestId;
use crate::scheduler::policy::StepDraft;
use crate::scheduler::request::Request;
use crate::scheduler::RequestClass;

impl Scheduler {
    /// The document whose TTFT deadline needs a chunk in this step, if any (`deadline_share`):
    /// a medium or long request without its first token whose remaining prefill, in its lane's
    /// chunks each predicted as a step alone with the decodes (`decodes`: attention and wave
    /// floor included), takes at least `deadline_share` of the time left to its deadline, and
    /// still fits in it. Of several, the earliest deadline: it keeps its place step after step,
    /// where ranking by room left would alternate between two and make both late. One that can
    /// no longer make it is not pulled (it progresses from slack): forcing lost causes through
    /// an overload would make the short requests late too; nor is one that `edf_documents`
    /// found lost behind earlier deadlines (`lost`).
    pub(super) fn most_due(
        &self,
        decodes: &StepDraft,
        now: f64,
        lost: &HashSet<RequestId>,
    ) -> Option<RequestId> {
        let share = self.cfg.merge.deadline_share;
        if !share.is_finite() {
            return None;
        }
        let docs = self.running.iter().chain(self.waiting.iter()).filter(|id| {
            let r = &self.requests[id];
            r.class != RequestClass::Short
                && r.num_output_tokens() == 0
                && !r.loading
                && !lost.contains(id)
        });
        let mut best: Option<(f64, RequestId)> = None;
        for &id in docs {
            let r = &self.requests[&id];
            let left_ms = (r.arrival - now) * 1e3 + self.cfg.slo.of(r.class).ttft_ms;
            if left_ms <= 0.0 || best.is_some_and(|(d, _)| d <= left_ms) {
                continue;
            }
            let need_ms = self.prefill_need_ms(r, decodes, left_ms);
            if need_ms >= share * left_ms && need_ms < left_ms {
                best = Some((left_ms, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// Predicted time of `req`'s remaining prefill in its lane's chunks, each as a step alone
    /// with `decodes`; the sum stops once it reaches `enough_ms`.
    pub(super) fn prefill_need_ms(
        &self,
        req: &Request,
        decodes: &StepDraft,
        enough_ms: f64,
    ) -> f64 {
        let chunk = match req.class {
            RequestClass::Long => self.cfg.classes.long_prefill_budget,
            _ => self.capped_chunk(self.cfg.max_num_batched_tokens),
        };
        let (mut done, end, mut need_ms) = (req.num_computed, req.compute_target(), 0.0);
        while done < end && need_ms <= enough_ms {
            let q = chunk.min(end - done);
            let mut f = decodes.features;
            f.add_seq(q, done + q);
            need_ms += self.cost.predict_ms(&f);
            done += q;
        }
        need_ms
    }
}
