//! The adaptive policy's rules, each against the fake model and explicit times: classes, lanes,
//! every merge reason, the SLO monitor's hysteresis, emergency pauses, admission control, and
//! the online cost model.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::scheduler::cost_model::{CostModel, StepFeatures};
use crate::scheduler::policy::{should_merge, Candidate, MergeContext, StepDraft};
use crate::scheduler::slo::SloMetric;

/// Adaptive, small shapes: short < 8 tokens, long > 40, 8 long tokens per step; emergency
/// mode and early rejection off (their own tests turn them on).
pub(super) fn adaptive() -> SchedulerConfig {
    SchedulerConfig {
        policy: Policy::Adaptive,
        classes: ClassConfig {
            short_below: 8,
            long_above: 40,
            long_prefill_budget: 8,
        },
        emergency: EmergencyConfig {
            enabled: false,
            ..EmergencyConfig::default()
        },
        admission: AdmissionConfig {
            early_reject: false,
            ..AdmissionConfig::default()
        },
        ..config()
    }
}

/// 5 ms a step, 1 ms per prefill token and per decode: steps whose cost is easy to reason about.
pub(super) fn coarse_cost() -> CostCoefficients {
    CostCoefficients {
        base_ms: 5.0,
        per_prefill_token_ms: 1.0,
        per_decode_seq_ms: 1.0,
        per_kv_token_ms: 0.0,
        per_prefill_attn_pair_ms: 0.0,
    }
}

#[test]
fn classes_follow_prompt_length_thresholds() {
    let cfg = ClassConfig::default();
    let class = |n| RequestClass::classify(n, &cfg);
    assert_eq!(class(1), RequestClass::Short);
    assert_eq!(class(127), RequestClass::Short);
    assert_eq!(class(128), RequestClass::Medium);
    assert_eq!(class(8192), RequestClass::Medium);
    assert_eq!(class(8193), RequestClass::Long);

    let mut e = Engine::new(adaptive(), 64);
    e.add(request(1).prompt_len(7));
    e.add(request(2).prompt_len(8));
    e.add(request(3).prompt_len(41));
    assert_eq!(e.sched.stats().accepted, [1, 1, 1]);
}

#[test]
fn fast_lane_admits_short_prompts_first_and_whole() {
    let cfg = SchedulerConfig {
        long_prefill_token_threshold: 16,
        ..adaptive()
    };
    let mut e = Engine::new(cfg.clone(), 64);
    e.add(request(1).prompt_len(30));
    e.add(request(2).prompt_len(5));
    let (out, _) = e.step();
    assert_eq!(scheduled(&out), vec![(2, 5), (1, 16)]);
    e.run_to_completion();
    e.assert_matches_reference();

    // FCFS serves the same queue in arrival order.
    let mut f = Engine::new(
        SchedulerConfig {
            policy: Policy::Fcfs,
            ..cfg
        },
        64,
    );
    f.add(request(1).prompt_len(30));
    f.add(request(2).prompt_len(5));
    let (out, _) = f.step();
    assert_eq!(scheduled(&out), vec![(1, 16), (2, 5)]);
}

#[test]
fn long_prompts_stream_under_the_long_budget_beside_short_ones() {
    let mut e = Engine::new(adaptive(), 128);
    e.add(request(1).prompt_len(100));
    e.add(request(2).prompt_len(60));
    let mut next = 3;
    while e.sched.has_unfinished() {
        if next < 12 {
            e.add(request(next).prompt_len(4));
        }
        let (out, _) = e.step();
        let long: usize = out
            .num_scheduled_tokens()
            .filter(|&(id, n)| id.0 <= 2 && n > 1)
            .map(|(_, n)| n)
            .sum();
        assert!(long <= 8, "long prefill of {long} tokens in one step");
        if next < 12 {
            // The short request that arrived this step is in it, whole.
            assert!(scheduled(&out).contains(&(next, 4)));
            next += 1;
        }
    }
    assert!(e.sched.stats().merge_count(MergeReason::LongBudget) > 0);
    e.assert_matches_reference();
}

#[test]
fn adaptive_trims_prefill_to_the_decodes_itl() {
    // Decodes' ITL target: 50 ms × 0.9 = 45 ms; 5 ms base + 1 ms per token or decode.
    let cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        max_num_batched_tokens: 256,
        long_prefill_token_threshold: 0,
        ..adaptive()
    };
    let mut e = Engine::new(cfg, 256);
    for id in 1..=4 {
        e.add(request(id).prompt_len(4).max_tokens(30).ignore_eos());
    }
    e.step();
    e.add(request(5).prompt_len(40));
    let (out, _) = e.step();
    // 5 + 4 decodes + n ≤ 45 → n = 36.
    assert_eq!(
        scheduled(&out),
        vec![(1, 1), (2, 1), (3, 1), (4, 1), (5, 36)]
    );
    assert_eq!(e.sched.stats().merge_count(MergeReason::Trimmed), 1);
    e.run_to_completion();
    e.assert_matches_reference();
}

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
    }
}

fn context() -> MergeContext {
    MergeContext {
        token_budget_left: 1000,
        seq_available: true,
        kv_headroom_blocks: 100.0,
        running_is_empty: false,
        short_ttft_slack_ms: f64::INFINITY,
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

pub(super) fn monitor_cfg() -> EmergencyConfig {
    EmergencyConfig {
        window_s: 10.0,
        min_samples: 5,
        exit_hold_s: 2.0,
        eval_interval_s: 0.0,
        ..EmergencyConfig::default()
    }
}

#[test]
fn monitor_enters_emergency_when_a_p95_exceeds_its_slo() {
    let slo = SloConfig::default(); // short: 300 ms TTFT
    let mut m = SloMonitor::new(monitor_cfg(), slo);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for i in 0..4 {
        m.record(
            RequestClass::Short,
            SloMetric::Ttft,
            i as f64 * 0.1,
            rng.random_range(400.0..900.0),
        );
    }
    assert_eq!(m.evaluate(0.5), None, "4 samples are too few to judge");
    // 96 fast and 4 slow: the P95 (95th of 100) is a fast one.
    for i in 0..96 {
        m.record(
            RequestClass::Short,
            SloMetric::Ttft,
            0.5 + i as f64 * 1e-3,
            rng.random_range(50.0..250.0),
        );
    }
    m.record(RequestClass::Medium, SloMetric::Itl, 0.7, 20.0);
    assert_eq!(m.evaluate(0.8), None);
    for i in 0..6 {
        m.record(
            RequestClass::Short,
            SloMetric::Ttft,
            0.9 + i as f64 * 0.01,
            rng.random_range(400.0..900.0),
        );
    }
    match m.evaluate(1.0) {
        Some(EmergencyTransition::Entered {
            class,
            metric,
            p95_ms,
            slo_ms,
        }) => {
            assert_eq!(
                (class, metric, slo_ms),
                (RequestClass::Short, SloMetric::Ttft, 300.0)
            );
            assert!(p95_ms > 400.0);
        }
        other => panic!("expected entry, got {other:?}"),
    }
    assert!(m.in_emergency());
}

#[test]
fn monitor_leaves_emergency_only_after_a_calm_hold() {
    let mut m = SloMonitor::new(monitor_cfg(), SloConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut record = |m: &mut SloMonitor, t: f64, lo: f64, hi: f64| {
        for i in 0..20 {
            m.record(
                RequestClass::Long,
                SloMetric::Itl,
                t + i as f64 * 1e-3,
                rng.random_range(lo..hi),
            );
        }
    };
    record(&mut m, 0.0, 60.0, 90.0); // ITL SLO is 50 ms
    assert!(matches!(
        m.evaluate(0.1),
        Some(EmergencyTransition::Entered { .. })
    ));
    // The slow samples leave the 10 s window at t = 10.02; calm from then on.
    record(&mut m, 9.0, 10.0, 40.0);
    assert_eq!(m.evaluate(9.5), None);
    assert!(m.in_emergency(), "the slow samples are still in the window");
    assert_eq!(m.evaluate(10.5), None, "calm, but not for exit_hold_s yet");
    // A breach inside the hold restarts it.
    record(&mut m, 11.0, 60.0, 90.0);
    assert_eq!(m.evaluate(11.5), None);
    record(&mut m, 12.0, 10.0, 40.0);
    assert_eq!(m.evaluate(21.1), None, "calm starts again at 21.1");
    assert_eq!(m.evaluate(22.0), None);
    assert_eq!(m.evaluate(23.2), Some(EmergencyTransition::Left));
    assert!(!m.in_emergency());
}

#[test]
fn monitor_evaluates_at_most_every_interval() {
    let cfg = EmergencyConfig {
        eval_interval_s: 1.0,
        ..monitor_cfg()
    };
    let mut m = SloMonitor::new(cfg, SloConfig::default());
    assert_eq!(m.evaluate(0.0), None);
    for i in 0..10 {
        m.record(RequestClass::Short, SloMetric::Ttft, 0.1, 1000.0 + i as f64);
    }
    assert_eq!(m.evaluate(0.5), None, "within the interval");
    assert!(m.evaluate(1.0).is_some());
}

/// Adaptive with emergency mode on: a 15 ms short TTFT SLO that 50 ms steps break, evaluated
/// every step over a short window.
pub(super) fn emergency_config() -> SchedulerConfig {
    SchedulerConfig {
        slo: SloConfig {
            short: ClassSlo {
                ttft_ms: 15.0,
                itl_ms: 200.0,
            },
            ..SloConfig::default()
        },
        emergency: EmergencyConfig {
            enabled: true,
            min_samples: 3,
            window_s: 0.2,
            exit_hold_s: 0.1,
            eval_interval_s: 0.0,
            ..EmergencyConfig::default()
        },
        ..adaptive()
    }
}

#[test]
fn emergency_pauses_long_sequences_until_it_ends() {
    let mut e = Engine::new(emergency_config(), 64);
    e.step_s = 0.05; // TTFT of every short request: 50 ms > 15 ms
    e.add(request(1).prompt_len(30).max_tokens(40).ignore_eos());
    for id in 2..=5 {
        e.add(request(id).prompt_len(3).max_tokens(30).ignore_eos());
    }
    e.step(); // first tokens: 4 short TTFTs of 50 ms
    let (out, _) = e.step(); // the monitor sees them: 31 tokens > 2 × mean 9.4
    assert_eq!(out.preempted, vec![RequestId(1)]);
    assert!(e.sched.in_emergency());
    assert!(e.sched.non_core_metrics_suspended());
    let s = e.sched.stats();
    assert_eq!((s.emergency_entries, s.emergency_pauses), (1, 1));
    assert_eq!(s.emergency_breaches[RequestClass::Short.index()], [1, 0]);
    // Paused while emergency lasts, back after it.
    let mut resumed_at = None;
    while e.sched.has_unfinished() {
        let (out, _) = e.step();
        let runs = scheduled(&out).iter().any(|&(id, _)| id == 1);
        // Its resume may itself breach the ITL SLO again; a request is paused only once.
        assert!(
            !(runs && resumed_at.is_none() && e.sched.in_emergency()),
            "paused request ran in emergency mode"
        );
        if runs && resumed_at.is_none() {
            resumed_at = Some(e.steps);
        }
    }
    assert!(resumed_at.is_some());
    assert_eq!(e.sched.stats().emergency_pauses, 1);
    assert!(e.sched.stats().emergency_exits >= 1);
    e.assert_matches_reference();
}

/// The setup of `emergency_pauses_long_sequences_until_it_ends` (request 1 is the one over the
/// pause length), with `knob` applied: whether entering emergency mode paused or spared it.
fn pause_or_spare(knob: impl FnOnce(&mut SchedulerConfig), prompt: usize) -> (u64, u64) {
    let mut cfg = emergency_config();
    knob(&mut cfg);
    // Blocks enough for the long prompt's expected horizon beside the short requests'.
    let mut e = Engine::new(cfg, 256);
    e.step_s = 0.05;
    e.add(request(1).prompt_len(prompt).max_tokens(40).ignore_eos());
    for id in 2..=5 {
        e.add(request(id).prompt_len(3).max_tokens(30).ignore_eos());
    }
    e.step();
    e.step();
    assert!(e.sched.in_emergency());
    let s = e.sched.stats();
    let counts = (s.emergency_pauses, s.emergency_pauses_spared);
    e.run_to_completion();
    e.assert_matches_reference();
    counts
}

#[test]
fn emergency_spares_a_sequence_the_pause_would_make_miss_its_itl() {
    // Request 1 (medium, decoding since step 1): a 0.1 s pause adds ~3 ms to its mean ITL over
    // 39 gaps (SLO 50 ms), a 2 s one ~51 ms.
    assert_eq!(pause_or_spare(|_| {}, 30), (1, 0));
    assert_eq!(
        pause_or_spare(|c| c.emergency.exit_hold_s = 2.0, 30),
        (0, 1)
    );
}

#[test]
fn emergency_spares_a_sequence_the_pause_would_make_miss_its_ttft() {
    // Request 1 (long, 60 tokens streamed 8 a step) has no token yet when emergency mode starts:
    // waited 50 ms, plus a 0.1 s pause and its recompute, against a 4 s or a 0.1 s TTFT SLO.
    assert_eq!(pause_or_spare(|_| {}, 60), (1, 0));
    let tight = |c: &mut SchedulerConfig| c.slo.long.ttft_ms = 100.0;
    assert_eq!(pause_or_spare(tight, 60), (0, 1));
}

#[test]
fn admission_bounds_waiting_requests() {
    let cfg = SchedulerConfig {
        admission: AdmissionConfig {
            max_waiting_requests: 2,
            ..AdmissionConfig::default()
        },
        ..config()
    };
    let mut s = Scheduler::new(cfg.clone());
    assert!(s.add_request(request(1), 0.0).is_accepted());
    assert_eq!(s.add_request(request(1), 0.0), Admission::Duplicate);
    assert!(s.add_request(request(2), 0.0).is_accepted());
    let Admission::Overloaded {
        reason,
        retry_after_ms,
    } = s.add_request(request(3), 0.0)
    else {
        panic!("third request accepted");
    };
    assert_eq!(reason, OverloadReason::QueueRequests);
    let a = cfg.admission;
    assert!((a.min_retry_after_ms..=a.max_retry_after_ms).contains(&retry_after_ms));
    assert_eq!(s.stats().overloaded_count(OverloadReason::QueueRequests), 1);
    let err = s.add_request(request(4), 0.0).to_error().unwrap();
    assert_eq!((err.code(), err.http_status()), ("overloaded", 429));
    assert_eq!(err.retry_after_ms(), Some(retry_after_ms));

    // Admitted requests leave the queue: room again.
    let mut kv = KvCacheManager::new(64, BLOCK_SIZE, true);
    s.schedule(&mut kv, 0.0);
    assert!(s.add_request(request(5), 0.0).is_accepted());
}

#[test]
fn admission_bounds_waiting_prompt_tokens() {
    let cfg = SchedulerConfig {
        admission: AdmissionConfig {
            max_waiting_prompt_tokens: 30,
            ..AdmissionConfig::default()
        },
        ..config()
    };
    let mut s = Scheduler::new(cfg);
    assert!(s.add_request(request(1), 0.0).is_accepted()); // 13
    assert!(s.add_request(request(2).prompt_len(17), 0.0).is_accepted()); // 30
    assert_eq!(
        s.add_request(request(3).prompt_len(1), 0.0),
        Admission::Overloaded {
            reason: OverloadReason::QueueTokens,
            retry_after_ms: AdmissionConfig::default().min_retry_after_ms,
        }
    );
}

#[test]
fn retry_after_grows_with_the_queue() {
    let cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        admission: AdmissionConfig {
            max_waiting_requests: 3,
            min_retry_after_ms: 1,
            ..AdmissionConfig::default()
        },
        ..config()
    };
    let retry = |prompt: usize| {
        let mut s = Scheduler::new(cfg.clone());
        for id in 1..=3 {
            assert!(s
                .add_request(request(id).prompt_len(prompt), 0.0)
                .is_accepted());
        }
        match s.add_request(request(4), 0.0) {
            Admission::Overloaded { retry_after_ms, .. } => retry_after_ms,
            other => panic!("{other:?}"),
        }
    };
    // 3 × 10 tokens at 1 ms plus one 5 ms step; 3 × 100 tokens in 5 steps of 64.
    assert_eq!(retry(10), 35);
    assert_eq!(retry(100), 325);
}

#[test]
fn early_reject_refuses_an_unreachable_ttft() {
    let cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        classes: ClassConfig::default(),
        admission: AdmissionConfig {
            early_reject: true,
            ..AdmissionConfig::default()
        },
        ..adaptive()
    };
    // Medium TTFT SLO 800 ms; 1 ms per token, 5 ms per 64-token step: 200 + 500 tokens take
    // 760 ms, a 200-token prompt behind those 700 would take 975 ms.
    let mut s = Scheduler::new(cfg.clone());
    assert!(s.add_request(request(1).prompt_len(200), 0.0).is_accepted());
    assert!(s.add_request(request(2).prompt_len(500), 0.0).is_accepted());
    assert!(matches!(
        s.add_request(request(3).prompt_len(200), 0.0),
        Admission::Overloaded {
            reason: OverloadReason::TtftUnreachable,
            ..
        }
    ));
    // A short request is served before the medium queue: its bound ignores it.
    assert!(s.add_request(request(4).prompt_len(5), 0.0).is_accepted());
    // FCFS never rejects early.
    let mut f = Scheduler::new(SchedulerConfig {
        policy: Policy::Fcfs,
        ..cfg
    });
    for id in 1..=3 {
        assert!(f
            .add_request(request(id).prompt_len(700), 0.0)
            .is_accepted());
    }
}

/// Two short requests decoding (`max_num_seqs` 2), then more added one by one until one is
/// refused: how many were accepted, and the refusal's reason. Every request is `template` (a
/// 3-token prompt, 30 output tokens, eos ignored) under its own id; `knob` changes the config
/// or the template. 5 ms a step + 1 ms per decode; short TTFT SLO 250 ms.
fn slot_wait_admissions(
    knob: impl FnOnce(&mut SchedulerConfig, &mut NewRequest),
) -> (u64, Option<OverloadReason>) {
    let mut cfg = SchedulerConfig {
        max_num_seqs: 2,
        cost_fallback: coarse_cost(),
        admission: AdmissionConfig {
            early_reject: true,
            ..AdmissionConfig::default()
        },
        ..adaptive()
    };
    cfg.slo.short.ttft_ms = 250.0;
    let mut template = request(0).prompt_len(3).max_tokens(30).ignore_eos();
    knob(&mut cfg, &mut template);
    let req = |id: u64| NewRequest {
        id: RequestId(id),
        prompt_token_ids: random_tokens(1000 + id, 3),
        ..template.clone()
    };
    let mut e = Engine::new(cfg, 256);
    e.add(req(1));
    e.add(req(2));
    e.step(); // both produced their first token: 29 to go each
    for id in 3..10 {
        match e.sched.add_request(req(id), e.now()) {
            Admission::Accepted => {}
            Admission::Overloaded { reason, .. } => return (id - 3, Some(reason)),
            Admission::Duplicate => unreachable!(),
        }
    }
    (7, None)
}

#[test]
fn early_reject_refuses_a_request_no_slot_frees_for_in_time() {
    // Slots free after 29 steps of 7 ms (203 ms): the two first waiting requests take them and
    // start within 250 ms; the third would wait for one of theirs, 59 steps (413 ms).
    assert_eq!(
        slot_wait_admissions(|_, _| {}),
        (2, Some(OverloadReason::SlotWait))
    );
    // A tighter SLO: even the first slot frees too late.
    assert_eq!(
        slot_wait_admissions(|c, _| c.slo.short.ttft_ms = 150.0),
        (0, Some(OverloadReason::SlotWait))
    );
    // Running requests that may end at any token (eos on) can free a slot next step.
    assert_eq!(
        slot_wait_admissions(|_, r| Arc::make_mut(&mut r.params).ignore_eos = false),
        (7, None)
    );
    // Spare slots: nobody waits for one.
    assert_eq!(slot_wait_admissions(|c, _| c.max_num_seqs = 16), (7, None));
    // Early rejection off.
    assert_eq!(
        slot_wait_admissions(|c, _| c.admission.early_reject = false),
        (7, None)
    );
}

fn random_features(rng: &mut ChaCha8Rng) -> StepFeatures {
    let mut f = StepFeatures::default();
    for _ in 0..rng.random_range(1..64) {
        f.add_seq(1, rng.random_range(1..4000));
    }
    for _ in 0..rng.random_range(0..3) {
        let q = rng.random_range(2..2048);
        f.add_seq(q, q + rng.random_range(0..8000));
    }
    f
}

#[test]
fn cost_model_fit_recovers_the_step_time_from_a_wrong_prior() {
    let truth = CostCoefficients::default();
    let prior = CostCoefficients {
        base_ms: 20.0,
        per_prefill_token_ms: 0.001,
        per_decode_seq_ms: 0.5,
        per_kv_token_ms: 0.0,
        per_prefill_attn_pair_ms: 1e-4,
    };
    let mut model = CostModel::new(prior);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..400 {
        let f = random_features(&mut rng);
        let noise = 1.0 + 0.02 * (rng.random::<f64>() - 0.5);
        model.observe(&f, truth.predict_ms(&f) * noise);
    }
    assert!(model.is_fitted());
    let c = model.coefficients();
    assert!(c.validate().is_ok(), "negative coefficient in {c:?}");
    for _ in 0..50 {
        let f = random_features(&mut rng);
        let (want, got) = (truth.predict_ms(&f), model.predict_ms(&f));
        assert!(
            (got - want).abs() <= 0.03 * want,
            "predicted {got} ms, true {want} ms"
        );
    }
}

#[test]
fn cost_model_keeps_the_prior_of_an_unexcited_feature_and_stays_non_negative() {
    let prior = CostCoefficients::default();
    let mut model = CostModel::new(prior);
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for _ in 0..200 {
        // Decodes only, and a backend whose time falls with the batch: the fit must not go
        // negative, and prefill coefficients (never seen) stay at the prior.
        let mut f = StepFeatures::default();
        let n = rng.random_range(1..100);
        for _ in 0..n {
            f.add_seq(1, 100);
        }
        model.observe(&f, 20.0 - 0.1 * n as f64 + rng.random::<f64>());
    }
    let c = model.coefficients();
    assert!(c.validate().is_ok(), "{c:?}");
    let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
    assert!(
        same(c.per_prefill_token_ms, prior.per_prefill_token_ms),
        "{c:?}"
    );
    assert!(
        same(c.per_prefill_attn_pair_ms, prior.per_prefill_attn_pair_ms),
        "{c:?}"
    );
    assert_eq!(c.per_decode_seq_ms, 0.0);
}

#[test]
fn emergency_spares_the_class_whose_slo_broke() {
    // Medium ITL SLO of 1 ms: the long (medium-class) request breaches it itself.
    let cfg = SchedulerConfig {
        slo: SloConfig {
            medium: ClassSlo {
                ttft_ms: 1000.0,
                itl_ms: 1.0,
            },
            ..SloConfig::default()
        },
        emergency: EmergencyConfig {
            enabled: true,
            min_samples: 3,
            eval_interval_s: 0.0,
            ..EmergencyConfig::default()
        },
        ..adaptive()
    };
    let mut e = Engine::new(cfg, 64);
    e.add(request(1).prompt_len(30).max_tokens(20).ignore_eos());
    for id in 2..=5 {
        e.add(request(id).prompt_len(3).max_tokens(20).ignore_eos());
    }
    for _ in 0..6 {
        e.step();
    }
    let s = e.sched.stats();
    assert_eq!(s.emergency_breaches[RequestClass::Medium.index()], [0, 1]);
    assert_eq!(s.emergency_pauses, 0);
    e.run_to_completion();
    e.assert_matches_reference();
}

#[test]
fn a_paused_request_resumes_when_nothing_else_runs() {
    let mut cfg = SchedulerConfig {
        slo: SloConfig {
            short: ClassSlo {
                ttft_ms: 15.0,
                itl_ms: 200.0,
            },
            ..SloConfig::default()
        },
        emergency: EmergencyConfig {
            enabled: true,
            min_samples: 3,
            exit_hold_s: 1e6, // emergency mode never ends in this test
            eval_interval_s: 0.0,
            ..EmergencyConfig::default()
        },
        ..adaptive()
    };
    // An SLO the endless pause cannot break, or the pause would spare request 1.
    cfg.slo.medium = ClassSlo {
        ttft_ms: 1e12,
        itl_ms: 1e12,
    };
    let mut e = Engine::new(cfg, 64);
    e.step_s = 0.05;
    e.add(request(1).prompt_len(30).max_tokens(20).ignore_eos());
    for id in 2..=5 {
        e.add(request(id).prompt_len(3).max_tokens(3).ignore_eos());
    }
    e.step();
    let (out, _) = e.step();
    assert_eq!(out.preempted, vec![RequestId(1)]);
    // The short requests finish; then request 1 runs again although emergency mode lasts.
    e.run_to_completion();
    assert!(e.sched.in_emergency());
    e.assert_matches_reference();
}

/// Steps until request 1 (a medium prompt queued first) is first scheduled while two short
/// requests arrive every step and max_num_seqs 2 keeps every slot contested.
fn steps_until_medium_runs(promote_after: f64) -> Option<usize> {
    let mut cfg = SchedulerConfig {
        max_num_seqs: 2,
        ..adaptive()
    };
    cfg.slo.medium.ttft_ms = 100.0; // 10 steps of 10 ms
    cfg.merge.promote_after = promote_after;
    let mut e = Engine::new(cfg, 256);
    e.add(request(1).prompt_len(20));
    let mut next = 2;
    for step in 0..40 {
        for _ in 0..2 {
            e.add(request(next).prompt_len(4).max_tokens(3).ignore_eos());
            next += 1;
        }
        let (out, _) = e.step();
        if out.num_scheduled_tokens().any(|(id, _)| id.0 == 1) {
            return Some(step);
        }
    }
    None
}

#[test]
fn waiting_documents_are_promoted_ahead_of_the_fast_lane_at_their_deadline() {
    // Promoted at half its 100 ms TTFT SLO (5 steps), it takes the next free slot.
    let promoted = steps_until_medium_runs(0.5).expect("the medium request never ran");
    assert!(
        (5..=8).contains(&promoted),
        "first scheduled at step {promoted}"
    );
    // Without promotion the stream of short requests keeps every slot.
    assert_eq!(steps_until_medium_runs(f64::INFINITY), None);
}

#[test]
fn a_short_prompt_longer_than_the_step_budget_is_chunked() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 16,
        classes: ClassConfig {
            short_below: 64,
            long_above: 128,
            ..adaptive().classes
        },
        ..adaptive()
    };
    let mut e = Engine::new(cfg, 64);
    e.add(request(1).prompt_len(40).max_tokens(4).ignore_eos());
    let (out, _) = e.step();
    assert_eq!(scheduled(&out), vec![(1, 16)]);
    e.run_to_completion();
    e.assert_matches_reference();
}
