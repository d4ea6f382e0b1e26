//! The adaptive policy's guards that learn from what happened: the ITL guard's slack (how far
//! ahead of its mean-ITL SLO each decode runs), the SLO monitor's mean-ITL signal, and the pause
//! guard's estimate of how long emergency periods last.

use super::adaptive::{adaptive, coarse_cost, emergency_config, monitor_cfg};
use super::*;
use crate::scheduler::slo::SloMetric;

/// Four short requests decoding (first tokens after one 10 ms step), `decode_steps` more
/// decode steps of `step_s` each, then a 40-token medium prompt arrives: the tokens of it the
/// next step takes. Cost: 5 ms a step + 1 ms per prefill token or decode; ITL SLO 50 ms × 0.9.
fn prefill_merged_after(decode_steps: usize, step_s: f64) -> usize {
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
    e.step_s = step_s;
    for _ in 0..decode_steps {
        e.step();
    }
    tokens_merged_for_a_new_prompt(&mut e)
}

/// Adds a 40-token prompt (request 5) to `e`, steps once and returns how many of its tokens
/// that step merged; then runs everything to completion against the reference.
pub(super) fn tokens_merged_for_a_new_prompt(e: &mut Engine) -> usize {
    e.add(request(5).prompt_len(40));
    let (out, _) = e.step();
    let tokens = scheduled(&out)
        .iter()
        .find(|&&(id, _)| id == 5)
        .map_or(0, |&(_, n)| n);
    e.run_to_completion();
    e.assert_matches_reference();
    tokens
}

#[test]
fn decodes_ahead_of_their_itl_pace_let_a_longer_step_through() {
    // (Also the plain ITL trim: four decodes bound a merged prefill by their SLO.)
    // Just after their first token the decodes have no slack: 5 + 4 + n ≤ 45 → 36 tokens.
    assert_eq!(prefill_merged_after(0, 0.01), 36);
    // One 10 ms gap against 45 ms banks 35 ms: the whole prompt (49 ms) fits.
    assert_eq!(prefill_merged_after(1, 0.01), 40);
}

#[test]
fn decodes_behind_their_itl_pace_bound_the_step_by_the_slo_itself() {
    // Three 60 ms gaps: 45 ms behind the pace; the bound stays the SLO × headroom, not less.
    assert_eq!(prefill_merged_after(3, 0.06), 36);
}

/// Four short requests (100 ms ITL SLO, TTFT never at issue) decode 30 tokens in 10 ms steps,
/// except for `slow_steps` steps of `slow_s` from their 4th token: whether emergency mode
/// started.
fn emergency_after_slow_steps(slow_steps: usize, slow_s: f64) -> bool {
    let mut cfg = SchedulerConfig {
        emergency: EmergencyConfig {
            enabled: true,
            min_samples: 3,
            window_s: 10.0,
            eval_interval_s: 0.0,
            ..EmergencyConfig::default()
        },
        ..adaptive()
    };
    cfg.slo.short = ClassSlo {
        ttft_ms: 1e6,
        itl_ms: 100.0,
        e2e_ms: f64::INFINITY,
    };
    let mut e = Engine::new(cfg, 256);
    for id in 1..=4 {
        e.add(request(id).prompt_len(4).max_tokens(30).ignore_eos());
    }
    for step in 0.. {
        if !e.sched.has_unfinished() {
            break;
        }
        e.step_s = if (3..3 + slow_steps).contains(&step) {
            slow_s
        } else {
            0.01
        };
        e.step();
    }
    e.assert_matches_reference();
    e.sched.stats().emergency_entries > 0
}

#[test]
fn emergency_mode_watches_each_requests_mean_itl_not_single_gaps() {
    // Two 150 ms gaps in 29 (7 % of them over the 100 ms SLO): every request's mean stays
    // under 66 ms, so nothing breaches, although the gaps' P95 would.
    assert!(!emergency_after_slow_steps(2, 0.15));
    // Three 400 ms gaps: the means reach (30 + 1200) / 6 ms ≈ 205 ms.
    assert!(emergency_after_slow_steps(3, 0.4));
}

#[test]
fn monitor_estimates_how_long_emergency_periods_last() {
    // exit_hold_s 2 s; ITL SLO of the long class 50 ms.
    let mut m = SloMonitor::new(monitor_cfg(), SloConfig::default());
    assert_eq!(m.expected_duration_s(), 2.0, "before any period ended");
    let period = |m: &mut SloMonitor, start: f64, calm_at: f64| {
        for i in 0..20 {
            m.record(RequestClass::Long, SloMetric::Itl, start, 80.0 + i as f64);
        }
        assert!(matches!(
            m.evaluate(start),
            Some(EmergencyTransition::Entered { .. })
        ));
        // The slow samples leave the 10 s window; calm for the 2 s hold from `calm_at`.
        assert_eq!(m.evaluate(calm_at), None);
        assert_eq!(m.evaluate(calm_at + 2.0), Some(EmergencyTransition::Left));
    };
    period(&mut m, 0.0, 12.0); // 14 s
    assert_eq!(m.expected_duration_s(), 14.0);
    period(&mut m, 100.0, 110.5); // 12.5 s: the running mean moves halfway
    assert_eq!(m.expected_duration_s(), 13.25);
}

/// An emergency period of about `first_s` seconds (short requests arriving every 50 ms step
/// against a 15 ms TTFT SLO, none long enough to pause), then the setup of
/// `emergency_pauses_long_sequences_until_it_ends`: request 100 (medium, 40 tokens out) is over
/// the pause length when emergency mode starts again. Its (pauses, spared) at that entry.
fn second_entry_pauses_or_spares(first_s: f64) -> (u64, u64) {
    let mut e = Engine::new(emergency_config(), 256);
    e.step_s = 0.05;
    let mut next = 1;
    while e.now() < first_s {
        e.add(request(next).prompt_len(3).max_tokens(2).ignore_eos());
        next += 1;
        e.step();
    }
    e.run_to_completion();
    // Calm: the 0.2 s window empties, then the 0.1 s hold.
    while e.sched.in_emergency() {
        e.step();
    }
    let before = e.sched.stats().clone();
    e.add(request(100).prompt_len(30).max_tokens(40).ignore_eos());
    for id in 101..=104 {
        e.add(request(id).prompt_len(3).max_tokens(30).ignore_eos());
    }
    e.step();
    e.step();
    assert!(e.sched.in_emergency());
    let s = e.sched.stats();
    let counts = (
        s.emergency_pauses - before.emergency_pauses,
        s.emergency_pauses_spared - before.emergency_pauses_spared,
    );
    e.run_to_completion();
    e.assert_matches_reference();
    counts
}

#[test]
fn the_pause_guard_weighs_a_pause_by_how_long_emergencies_lasted() {
    // No period seen: a pause is taken to last exit_hold_s (0.1 s), ~3 ms on request 100's mean
    // ITL over 39 gaps (SLO 50 ms): paused.
    assert_eq!(second_entry_pauses_or_spares(0.0), (1, 0));
    // After a period of ~2.3 s a pause is expected to last as long: ~60 ms on its mean: spared.
    assert_eq!(second_entry_pauses_or_spares(2.0), (0, 1));
}
