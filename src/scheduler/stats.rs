//! Counters of the scheduler's decisions, cumulative since start, for the actor to export as
//! metrics (each array is indexed by its enum's `index()`; `as_str()` gives the label).

use serde::Serialize;

use crate::scheduler::admission::OverloadReason;
use crate::scheduler::policy::MergeReason;
use crate::scheduler::slo::SloMetric;
use crate::scheduler::swap::PreemptDecision;
use crate::scheduler::RequestClass;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SchedulerStats {
    /// Merge decisions by reason (adaptive policy).
    pub merge_decisions: [u64; MergeReason::ALL.len()],
    /// Requests accepted, by class.
    pub accepted: [u64; 3],
    /// Requests refused at admission, by reason.
    pub overloaded: [u64; OverloadReason::ALL.len()],
    /// Preemptions (by swap or recompute), emergency pauses included.
    pub preemptions: u64,
    /// How each preemption gave up its blocks, by decision.
    pub preempt_decisions: [u64; PreemptDecision::ALL.len()],
    /// Sequences paused on entering emergency mode.
    pub emergency_pauses: u64,
    /// Sequences over the pause length not paused: the pause alone would break their own SLO.
    pub emergency_pauses_spared: u64,
    pub emergency_entries: u64,
    pub emergency_exits: u64,
    /// Emergency entries by the breach that caused them: [class][ttft, itl].
    pub emergency_breaches: [[u64; 2]; 3],
}

impl SchedulerStats {
    pub fn merge_count(&self, reason: MergeReason) -> u64 {
        self.merge_decisions[reason.index()]
    }

    pub fn overloaded_count(&self, reason: OverloadReason) -> u64 {
        self.overloaded[reason.index()]
    }

    pub fn preempt_count(&self, d: PreemptDecision) -> u64 {
        self.preempt_decisions[d.index()]
    }

    pub(crate) fn count_merge(&mut self, reason: MergeReason) {
        self.merge_decisions[reason.index()] += 1;
    }

    pub(crate) fn count_breach(&mut self, class: RequestClass, metric: SloMetric) {
        self.emergency_entries += 1;
        self.emergency_breaches[class.index()][metric as usize] += 1;
    }
}
