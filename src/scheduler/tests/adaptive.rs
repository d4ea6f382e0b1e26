//! The adaptive policy's rules, each against the fake model and explicit times: classes, lanes,
//! the SLO monitor's hysteresis and emergency pauses. The merge policy's reasons are in
//! `merge.rs`, admission control and the cost model in `admission.rs`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
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
        per_prefill_floor_pair_ms: 0.0,
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
                e2e_ms: f64::INFINITY,
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
fn emergency_spares_the_class_whose_slo_broke() {
    // Medium ITL SLO of 1 ms: the long (medium-class) request breaches it itself.
    let cfg = SchedulerConfig {
        slo: SloConfig {
            medium: ClassSlo {
                ttft_ms: 1000.0,
                itl_ms: 1.0,
                e2e_ms: f64::INFINITY,
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
    let mut cfg = emergency_config();
    cfg.emergency.exit_hold_s = 1e6; // emergency mode never ends in this test
    cfg.emergency.window_s = EmergencyConfig::default().window_s;
    // An SLO the endless pause cannot break, or the pause would spare request 1.
    cfg.slo.medium = ClassSlo {
        ttft_ms: 1e12,
        itl_ms: 1e12,
        e2e_ms: f64::INFINITY,
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
