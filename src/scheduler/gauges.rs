//! Copies the scheduler core's and the KV manager's state into the Prometheus metrics; the
//! scheduler actor calls it after each step and on idle. Both keep cumulative counters of their
//! own, so the metric counters only follow them.

use crate::kv::KvCacheManager;
use crate::metrics::Metrics;
use crate::scheduler::spec::Ceiling;
use crate::scheduler::{
    MergeReason, OverloadReason, PreemptDecision, RequestClass, Scheduler, SchedulerOutput,
};
use crate::step::StepOutput;

/// A step came back from the executor. Its token count is a non-core metric: emergency mode
/// suspends it.
pub(crate) fn observe_step(
    m: &Metrics,
    core: &Scheduler,
    plan: &SchedulerOutput,
    step: &StepOutput,
) {
    m.step_time.observe(step.elapsed.as_secs_f64());
    if !core.non_core_metrics_suspended() {
        m.step_tokens
            .observe(plan.total_num_scheduled_tokens() as f64);
    }
}

/// Decision counters and emergency mode of the core.
pub(crate) fn sync_scheduler(m: &Metrics, core: &Scheduler) {
    let st = core.stats();
    for r in MergeReason::ALL {
        follow(
            &m.merge_decisions.with_label_values(&[r.as_str()]),
            st.merge_count(r),
        );
    }
    for r in OverloadReason::ALL {
        follow(
            &m.overloaded.with_label_values(&[r.as_str()]),
            st.overloaded_count(r),
        );
    }
    for c in RequestClass::ALL {
        follow(
            &m.accepted.with_label_values(&[c.as_str()]),
            st.accepted[c.index()],
        );
    }
    follow(&m.preemptions, st.preemptions);
    for d in PreemptDecision::ALL {
        follow(
            &m.preemption_decisions.with_label_values(&[d.as_str()]),
            st.preempt_count(d),
        );
    }
    follow(&m.emergency_pauses, st.emergency_pauses);
    follow(&m.emergency_pauses_spared, st.emergency_pauses_spared);
    follow(&m.emergency_entries, st.emergency_entries);
    follow(&m.emergency_exits, st.emergency_exits);
    m.emergency_mode.set(core.in_emergency() as i64);
    sync_spec(m, core);
}

/// Speculative decoding counters (nothing while the engine does not speculate).
fn sync_spec(m: &Metrics, core: &Scheduler) {
    if !core.spec_config().enabled() {
        return;
    }
    let st = core.spec_stats();
    follow(&m.spec_drafts, st.num_drafts);
    follow(&m.spec_draft_tokens, st.num_draft_tokens);
    follow(&m.spec_accepted_tokens, st.num_accepted_tokens);
    for (pos, (&acc, &prop)) in st
        .accepted_per_pos
        .iter()
        .zip(&st.proposed_per_pos)
        .enumerate()
    {
        let label = pos.to_string();
        follow(&m.spec_accepted_per_pos.with_label_values(&[&label]), acc);
        follow(&m.spec_proposed_per_pos.with_label_values(&[&label]), prop);
    }
    if let Some(len) = st.mean_accepted_length() {
        m.spec_mean_accepted_length.set(len);
    }
    m.spec_depth.set(st.current_depth);
    for c in Ceiling::ALL {
        let n = st.steps_by_ceiling[c.index()];
        if n > 0 {
            follow(&m.spec_steps.with_label_values(&[c.as_str()]), n);
        }
    }
}

/// Queue lengths, block usage and prefix-cache counters.
pub(crate) fn sync_all(m: &Metrics, core: &Scheduler, kv: &KvCacheManager) {
    sync_scheduler(m, core);
    m.requests_running.set(core.num_running() as i64);
    m.requests_waiting.set(core.num_waiting() as i64);
    let u = kv.usage();
    m.kv_blocks_used.set(u.used_blocks as i64);
    m.kv_blocks_total.set(u.total_blocks as i64);
    m.kv_usage_ratio.set(u.usage_ratio());
    let prefix = kv.prefix_cache_stats();
    follow(&m.prefix_cache_queries, prefix.queried_tokens);
    follow(&m.prefix_cache_hits, prefix.hit_tokens);
    follow(&m.prefix_cache_host_hits, prefix.host_hit_tokens);
    if let Some(h) = kv.host_usage() {
        m.kv_host_blocks_used.set(h.used_blocks as i64);
        m.kv_host_blocks_total.set(h.total_blocks as i64);
    }
    let t = kv.tier_stats();
    let bytes = kv.block_bytes() as u64;
    for (dir, blocks) in [
        ("out", t.swap_out_blocks),
        ("in", t.swap_in_blocks),
        ("cow", t.cow_blocks),
    ] {
        follow(&m.kv_copy_blocks.with_label_values(&[dir]), blocks);
        follow(&m.kv_copy_bytes.with_label_values(&[dir]), blocks * bytes);
    }
    follow(
        &m.kv_swapped_requests.with_label_values(&["out"]),
        t.swapped_out_requests,
    );
    follow(
        &m.kv_swapped_requests.with_label_values(&["in"]),
        t.swapped_in_requests,
    );
}

/// Raises a counter to a cumulative total kept elsewhere.
fn follow(counter: &prometheus::IntCounter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}
