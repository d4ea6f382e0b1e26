//! The depth policy: the rules (KV pressure, emergency mode, warm-up), acceptance, batch size.

use super::*;
use crate::scheduler::cost_model::CostCoefficients;
use crate::spec::SpecMethod;

fn cfg() -> SpecConfig {
    SpecConfig {
        method: SpecMethod::Ngram,
        max_depth: 4,
        ..SpecConfig::default()
    }
}

/// A target whose step costs `base` plus `per_row` for every query row, decode or prefill: a
/// compute-bound machine when `per_row` is large against `base`.
fn target(base: f64, per_row: f64) -> CostModel {
    CostModel::new(CostCoefficients {
        base_ms: base,
        per_prefill_token_ms: per_row,
        per_decode_seq_ms: per_row,
        per_kv_token_ms: 0.0,
        per_prefill_attn_pair_ms: 0.0,
        per_prefill_floor_pair_ms: 0.0,
    })
}

/// `choose_depth` with a fresh verification fit (the tests about verification pass their own).
fn choose(
    target: &CostModel,
    draft: &DraftCost,
    decodes: &StepFeatures,
    alphas: &[f64],
    others: usize,
    catch_up: usize,
    ceiling: usize,
) -> DepthChoice {
    choose_depth(
        Fits {
            target,
            verify: &VerifyCost::default(),
            draft,
        },
        decodes,
        alphas,
        others,
        catch_up,
        ceiling,
    )
}

fn decodes(b: usize) -> StepFeatures {
    let mut f = StepFeatures::default();
    for _ in 0..b {
        f.add_seq(1, 100);
    }
    f
}

#[test]
fn kv_pressure_turns_speculation_off() {
    assert_eq!(ceiling(&cfg(), 0.59, false, 100), (4, Ceiling::Normal));
    assert_eq!(ceiling(&cfg(), 0.61, false, 100), (0, Ceiling::KvPressure));
    // Pressure wins over emergency mode.
    assert_eq!(ceiling(&cfg(), 0.61, true, 100), (0, Ceiling::KvPressure));
}

#[test]
fn emergency_mode_caps_the_depth_at_one() {
    assert_eq!(ceiling(&cfg(), 0.1, true, 100), (1, Ceiling::Emergency));
    let shallow = SpecConfig {
        max_depth: 1,
        emergency_max_depth: 3,
        ..cfg()
    };
    assert_eq!(ceiling(&shallow, 0.1, true, 100).0, 1);
}

#[test]
fn off_and_warm_up_give_no_depth() {
    let off = SpecConfig {
        method: SpecMethod::Off,
        ..cfg()
    };
    assert_eq!(ceiling(&off, 0.0, false, 100), (0, Ceiling::Off));
    assert_eq!(
        ceiling(&cfg(), 0.0, false, MIN_FIT_STEPS - 1),
        (0, Ceiling::Warmup)
    );
}

#[test]
fn expected_tokens_is_the_truncated_geometric_sum() {
    assert_eq!(expected_tokens(0.5, 0), 1.0);
    assert!((expected_tokens(0.5, 3) - 1.875).abs() < 1e-12);
    assert_eq!(expected_tokens(1.0, 4), 5.0);
}

#[test]
fn a_single_stream_speculates_on_a_memory_bound_step() {
    // Batch 1 on the CPU: a 2 ms step whose extra rows cost 0.1 ms, a draft pass 0.3 ms.
    let t = target(2.0, 0.1);
    let mut d = DraftCost::default();
    for _ in 0..10 {
        d.observe(4, 4, 1.2);
    }
    let c = choose(&t, &d, &decodes(1), &[0.8], 0, 0, 4);
    assert_eq!(c.cap, 4, "{c:?}");
    assert_eq!(c.depth_for(0.8), 4);
}

#[test]
fn a_large_compute_bound_batch_does_not_speculate() {
    // Every row costs 0.25 ms: at batch 64 a verification row costs what a decode does.
    let t = target(2.0, 0.25);
    let d = DraftCost::default();
    assert!(choose(&t, &d, &decodes(1), &[0.8], 0, 0, 4).cap > 0);
    assert_eq!(choose(&t, &d, &decodes(64), &[0.8; 64], 0, 0, 4).cap, 0);
    // A perfect proposer still pays there: every row it adds is a token.
    assert_eq!(choose(&t, &d, &decodes(64), &[1.0; 64], 0, 0, 4).cap, 4);
}

#[test]
fn a_verification_row_costs_at_least_a_decode_row() {
    // A fit that put the prefill coefficient at 0 (steps of one shape): rows still cost what
    // a decode does, so a large batch does not speculate.
    let t = CostModel::new(CostCoefficients {
        base_ms: 2.0,
        per_prefill_token_ms: 0.0,
        per_decode_seq_ms: 1.0,
        per_kv_token_ms: 0.0,
        per_prefill_attn_pair_ms: 0.0,
        per_prefill_floor_pair_ms: 0.0,
    });
    let d = DraftCost::default();
    assert_eq!(choose(&t, &d, &decodes(64), &[0.7; 64], 0, 0, 4).cap, 0);
}

#[test]
fn a_memory_bound_gpu_speculates_at_batch_64_too() {
    // The H200 prior for a 7B model: rows are cheap against the weights' read.
    let t = CostModel::new(CostCoefficients::default());
    let c = choose_depth(
        Fits {
            target: &t,
            verify: &VerifyCost::default(),
            draft: &DraftCost::default(),
        },
        &decodes(64),
        &[0.7; 64],
        0,
        0,
        4,
    );
    assert!(c.cap > 0, "{c:?}");
}

#[test]
fn depth_falls_with_acceptance() {
    let t = target(2.0, 0.1);
    let mut d = DraftCost::default();
    d.observe(4, 4, 1.2);
    let c = choose(&t, &d, &decodes(4), &[0.9, 0.5, 0.1, 0.9], 0, 0, 4);
    assert!(c.cap > 0);
    let ks: Vec<usize> = [0.9, 0.5, 0.1, 0.02].map(|a| c.depth_for(a)).to_vec();
    assert!(ks.windows(2).all(|w| w[0] >= w[1]), "{ks:?}");
    assert!(ks[0] > ks[2], "{ks:?}");
    assert_eq!(c.depth_for(0.02), 0, "{ks:?}");
    // Nobody may speculate: no depth.
    assert_eq!(choose(&t, &d, &decodes(4), &[], 4, 0, 4), DepthChoice::NONE);
}

#[test]
fn acceptance_estimates_the_per_token_rate_whatever_the_depth() {
    let mut a = Acceptance::new(0.7);
    assert!((a.rate() - 0.7).abs() < 1e-12);
    // Depth 4, a stream with per-token acceptance 0.5: accepted 0,1,2,... drafts.
    let mut rng = 12345u64;
    for _ in 0..4000 {
        let mut acc = 0;
        while acc < 4 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (rng >> 33) % 2 == 0 {
                break;
            }
            acc += 1;
        }
        a.observe(4, acc, 0.01);
    }
    assert!((a.rate() - 0.5).abs() < 0.05, "{}", a.rate());
    // Nothing proposed: no change.
    let before = a;
    a.observe(0, 0, 0.5);
    assert_eq!(a, before);
    // Every draft rejected over and over: the estimate falls toward 0 (and stays there: only
    // a probe's verification moves it).
    for _ in 0..50 {
        a.observe(4, 0, 0.2);
    }
    assert!(a.rate() < 0.01, "{}", a.rate());
}

/// A held request's probes back off exponentially while they fail, and a fully accepted probe,
/// or drafting on its own estimate, starts the back-off over.
#[test]
fn a_held_request_is_probed_by_exponential_back_off() {
    let mut a = Acceptance::new(0.7);
    // Holds until its probe is due; returns how many steps that took.
    let hold_until_due = |a: &mut Acceptance| {
        let mut n = 0;
        while !a.probe_due() {
            a.hold();
            n += 1;
        }
        n
    };
    let mut waits = Vec::new();
    for _ in 0..6 {
        waits.push(hold_until_due(&mut a));
        a.drafted(true);
        a.observe(2, 1, 0.2); // not all accepted: a failed probe
    }
    assert_eq!(waits, [4, 8, 16, 32, 64, 64]);
    // A fully accepted probe: back to the first interval.
    hold_until_due(&mut a);
    a.drafted(true);
    a.observe(2, 2, 0.2);
    assert_eq!(a.probe_interval(), PROBE_FIRST);
    // A failed probe, then drafting on its own estimate (not a probe): back to the first
    // interval too, and that verification does not count as a probe.
    hold_until_due(&mut a);
    a.drafted(true);
    a.observe(2, 0, 0.2);
    assert_eq!(a.probe_interval(), 2 * PROBE_FIRST);
    a.drafted(false);
    a.observe(4, 0, 0.2);
    assert_eq!(a.probe_interval(), PROBE_FIRST);
    assert_eq!(hold_until_due(&mut a), PROBE_FIRST as usize);
}

#[test]
fn the_draft_cost_fit_recovers_pass_and_token_costs() {
    let mut d = DraftCost::default();
    assert_eq!(d.predict_ms(4, 8), 0.0, "untried drafting looks free");
    for (passes, tokens) in [(4, 4), (4, 16), (2, 2), (3, 30), (1, 64)] {
        d.observe(passes, tokens, 0.3 * passes as f64 + 0.05 * tokens as f64);
    }
    assert!((d.per_pass_ms() - 0.3).abs() < 0.01, "{d:?}");
    assert!((d.per_token_ms() - 0.05).abs() < 0.01, "{d:?}");
}

#[test]
fn the_draft_models_catch_up_can_price_speculation_out() {
    // Cheap rows (the H200 prior) and a measured draft: a batch of 64 that the draft model has
    // already caught up on speculates; the same batch whose 64-token prompts the draft has never
    // seen pays 4096 catch-up tokens first, and does not.
    let t = CostModel::new(CostCoefficients::default());
    let mut d = DraftCost::default();
    for (passes, tokens) in [(1, 64), (2, 128), (1, 200), (3, 192)] {
        d.observe(passes, tokens, 0.1 * passes as f64 + 0.002 * tokens as f64);
    }
    assert!(d.per_token_ms() > 0.0);
    let synced = choose(&t, &d, &decodes(64), &[0.7; 64], 0, 0, 4);
    assert!(synced.cap > 0, "{synced:?}");
    let fresh = choose(&t, &d, &decodes(64), &[0.7; 64], 0, 64 * 64, 4);
    assert_eq!(fresh.cap, 0, "{fresh:?}");
    // One request's catch-up is worth paying at a single stream.
    assert!(choose(&t, &d, &decodes(1), &[0.7], 0, 64, 4).cap > 0);
}

/// A verification fit from steps measured like the CPU pair's (single stream): the first
/// draft row adds `fixed` over a decode, each further one `per_row`.
fn verify(fixed: f64, per_row: f64) -> VerifyCost {
    let mut v = VerifyCost::default();
    for _ in 0..4 {
        for rows in 1..=4 {
            v.observe(rows, fixed + per_row * rows as f64);
        }
    }
    v
}

#[test]
fn the_verification_fit_splits_the_fixed_cost_from_the_rows() {
    let v = verify(0.3, 0.15);
    assert!(v.is_fitted());
    assert!((v.fixed_ms() - 0.3).abs() < 0.01, "{v:?}");
    assert!((v.per_row_ms() - 0.15).abs() < 0.01, "{v:?}");
    // Below MIN_SAMPLES it is not used; a step without rows or with a NaN time is no sample.
    let mut w = VerifyCost::default();
    w.observe(0, 1.0);
    w.observe(2, f64::NAN);
    assert_eq!(w.samples(), 0);
}

#[test]
fn a_fixed_verification_cost_turns_mediocre_acceptance_down_to_zero() {
    // The CPU pair's measured figures: a decode 0.6 ms, the first draft row +0.36, each row
    // after +0.13 (fixed 0.23 + 0.13 a row), a draft pass 0.15 ms.
    let t = target(0.6, 0.0);
    let mut d = DraftCost::default();
    for _ in 0..20 {
        d.observe(4, 4, 0.6);
        d.observe(2, 2, 0.3);
    }
    let one = |alpha: f64, v: &VerifyCost| {
        choose_depth(
            Fits {
                target: &t,
                verify: v,
                draft: &d,
            },
            &decodes(1),
            &[alpha],
            0,
            0,
            4,
        )
    };
    // Without the fixed term (no verification fit: rows priced by the target fit, 0 here)
    // acceptance 0.7 speculates; with it, it does not (k = 4 yields 2.77 tokens in ≈ 2.0 ms,
    // worse than 1 token in 0.6 ms).
    assert!(one(0.7, &VerifyCost::default()).cap > 0);
    assert_eq!(one(0.7, &verify(0.23, 0.13)).cap, 0);
    // High acceptance pays even the fixed cost, at full depth.
    assert_eq!(one(0.95, &verify(0.23, 0.13)).cap, 4);
}

#[test]
fn a_fixed_verification_cost_skips_shallow_depths() {
    // Fixed cost high, rows cheap: depth 1 cannot pay the fixed cost, depth 4 can.
    let t = target(0.6, 0.0);
    let d = DraftCost::default();
    let v = verify(0.6, 0.01);
    let c = choose_depth(
        Fits {
            target: &t,
            verify: &v,
            draft: &d,
        },
        &decodes(1),
        &[0.8],
        0,
        0,
        1,
    );
    assert_eq!(c.cap, 0, "{c:?}");
    let c = choose_depth(
        Fits {
            target: &t,
            verify: &v,
            draft: &d,
        },
        &decodes(1),
        &[0.8],
        0,
        0,
        4,
    );
    assert_eq!(c.cap, 4, "{c:?}");
}

#[test]
fn speculation_must_beat_depth_zero_by_a_margin() {
    // A decode 1 ms; drafting costs nothing, and verifying costs `fixed` once and no rows: at
    // acceptance 1 depth 1 yields 2 tokens in 1 + fixed ms.
    let t = target(1.0, 0.0);
    let d = DraftCost::default();
    let cap = |fixed: f64| {
        choose_depth(
            Fits {
                target: &t,
                verify: &verify(fixed, 0.0),
                draft: &d,
            },
            &decodes(1),
            &[1.0],
            0,
            0,
            1,
        )
        .cap
    };
    // 2 / 1.9 = 1.053 tokens per ms against 1: over the margin.
    assert_eq!(cap(0.9), 1);
    // 2 / 1.93 = 1.036: a gain, but under the margin.
    assert_eq!(cap(0.93), 0);
}
