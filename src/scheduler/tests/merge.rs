//! The batch-merge policy (`should_merge`) on explicit drafts and candidates: every merge reason,
//! and the KV horizon that keeps admissions from overcommitting memory.

use super::adaptive::{adaptive, coarse_cost};
use super::*;
use crate::scheduler::policy::{should_merge, Candidate, MergeContext, StepDraft};

/// 2 decodes (7 ms with `coarse_cost`), no prefill yet, a 45 ms ITL target.
fn draft() -> StepDraft {
    let mut d = StepDraft::new();
    d.add_decode(10, 45.0);
    d.add_decode(20, 45.0);
    d
}

fn candidate() -> Candidate {
    Candidate {
        lane: Lane::Normal,
        num_computed: 0,
        wanted: 20,
        min_tokens: 20.min(MergeConfig::default().min_chunk_tokens),
        kv_blocks_needed: 5,
        due: false,
    }
}

pub(super) fn context() -> MergeContext {
    MergeContext {
        token_budget_left: 1000,
        seq_available: true,
        kv_headroom_blocks: 100.0,
        running_is_empty: false,
        short_ttft_slack_ms: f64::INFINITY,
        doc_floor_ms: 0.0,
    }
}

fn merge(a: &StepDraft, b: &Candidate, ctx: &MergeContext) -> (MergeReason, usize) {
    let model = CostModel::new(coarse_cost());
    let d = should_merge(&model, &MergeConfig::default(), a, b, ctx);
    (d.reason, d.tokens)
}

#[test]
fn merge_fits_when_memory_and_latency_allow() {
    assert_eq!(
        merge(&draft(), &candidate(), &context()),
        (MergeReason::Fits, 20)
    );
}

#[test]
fn merge_trims_a_chunk_to_the_latency_bound() {
    let b = Candidate {
        wanted: 60,
        ..candidate()
    };
    // 7 ms + t ≤ 45 ms.
    assert_eq!(merge(&draft(), &b, &context()), (MergeReason::Trimmed, 38));
}

#[test]
fn merge_refuses_what_would_break_a_decodes_itl() {
    let mut a = draft();
    a.add_prefill(0, 30); // 37 ms: a 32-token minimum chunk no longer fits
    let b = Candidate {
        wanted: 100,
        min_tokens: 32,
        ..candidate()
    };
    assert_eq!(merge(&a, &b, &context()), (MergeReason::DecodeItl, 0));
}

#[test]
fn merge_forces_progress_into_a_step_without_prefill() {
    let mut a = StepDraft::new();
    for ctx in 0..45 {
        a.add_decode(ctx + 1, 45.0); // 50 ms of decodes alone
    }
    let b = Candidate {
        wanted: 500,
        ..candidate()
    };
    let progress = MergeConfig::default().progress_tokens;
    assert_eq!(merge(&a, &b, &context()), (MergeReason::Progress, progress));
}

#[test]
fn merge_refuses_what_would_delay_a_waiting_short_request() {
    let mut a = draft();
    a.add_prefill(0, 10);
    let ctx = MergeContext {
        short_ttft_slack_ms: 20.0, // 17 ms so far: 3 tokens would fit, less than a chunk
        ..context()
    };
    assert_eq!(merge(&a, &candidate(), &ctx), (MergeReason::ShortTtft, 0));
}

#[test]
fn merge_refuses_what_memory_cannot_hold_unless_nothing_runs() {
    let ctx = MergeContext {
        kv_headroom_blocks: 4.0,
        ..context()
    };
    assert_eq!(
        merge(&draft(), &candidate(), &ctx),
        (MergeReason::KvMemory, 0)
    );
    let idle = MergeContext {
        running_is_empty: true,
        ..ctx
    };
    assert_eq!(
        merge(&StepDraft::new(), &candidate(), &idle).0,
        MergeReason::Fits
    );
}

#[test]
fn merge_respects_token_budget_and_seq_limit() {
    let spent = MergeContext {
        token_budget_left: 0,
        ..context()
    };
    assert_eq!(
        merge(&draft(), &candidate(), &spent),
        (MergeReason::TokenBudget, 0)
    );
    // A short prompt is never split across steps.
    let short = Candidate {
        lane: Lane::FastLane,
        min_tokens: 20,
        ..candidate()
    };
    let tight = MergeContext {
        token_budget_left: 10,
        ..context()
    };
    assert_eq!(
        merge(&draft(), &short, &tight),
        (MergeReason::TokenBudget, 0)
    );
    let full = MergeContext {
        seq_available: false,
        ..context()
    };
    assert_eq!(
        merge(&draft(), &candidate(), &full),
        (MergeReason::SeqLimit, 0)
    );
}

#[test]
fn kv_horizon_keeps_admissions_from_overcommitting_memory() {
    // 16 blocks of 4 tokens; each request expects 6 outputs: (13 + 6) / 4 → 5 blocks.
    let cfg = SchedulerConfig {
        merge: MergeConfig {
            expected_output_tokens: 6,
            kv_watermark: 0.0,
            kv_threshold: 1.0,
            ..MergeConfig::default()
        },
        ..adaptive()
    };
    let mut e = Engine::new(cfg, 16);
    for id in 1..=4 {
        e.add(request(id).ignore_eos());
    }
    let (out, _) = e.step();
    assert_eq!(out.admitted.len(), 3);
    assert_eq!(e.sched.stats().merge_count(MergeReason::KvMemory), 1);
    e.run_to_completion();
    assert_eq!(e.sched.num_preemptions(), 0);
    e.assert_matches_reference();
}
