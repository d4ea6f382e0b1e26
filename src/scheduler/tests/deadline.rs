//! Issue 19's rules for a GPU whose prefill kernel has a wave floor: short answers paced to an
//! end-to-end SLO, documents pulled through by their TTFT deadlines in small chunks, trims that
//! would cost a whole wave floor refused, and the floor's own cost-model feature fitted for a
//! kernel with or without it. One knob at a time against the defaults.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::adaptive::{adaptive, coarse_cost};
use super::*;
use crate::scheduler::cost_model::{floor_pairs, StepFeatures, ATTN_FLOOR_QUERIES};
use crate::scheduler::policy::{should_merge, Candidate, MergeContext, StepDraft};

/// 2 decodes (7 ms with `coarse_cost`), no prefill yet, a 10 ms ITL bound: no chunk fits.
fn tight_draft() -> StepDraft {
    let mut d = StepDraft::new();
    d.add_decode(10, 10.0);
    d.add_decode(20, 10.0);
    d
}

fn doc(due: bool) -> Candidate {
    Candidate {
        lane: Lane::LongStream,
        num_computed: 0,
        wanted: 60,
        min_tokens: 32,
        kv_blocks_needed: 0,
        due,
    }
}

fn ctx(doc_floor_ms: f64) -> MergeContext {
    MergeContext {
        doc_floor_ms,
        ..super::merge::context()
    }
}

fn merge_with(
    cfg: &MergeConfig,
    cost: CostCoefficients,
    b: &Candidate,
    c: &MergeContext,
) -> (MergeReason, usize) {
    let d = should_merge(&CostModel::new(cost), cfg, &tight_draft(), b, c);
    (d.reason, d.tokens)
}

fn pull_on() -> MergeConfig {
    MergeConfig {
        deadline_share: 0.5,
        ..MergeConfig::default()
    }
}

#[test]
fn a_due_document_goes_over_the_itl_bound_trimmed_to_its_step_share() {
    // Decodes alone 7 ms + 40 ms share: 40 of its 60 tokens.
    assert_eq!(
        merge_with(&pull_on(), coarse_cost(), &doc(true), &ctx(47.0)),
        (MergeReason::Deadline, 40)
    );
    // Not due: the 10 ms bound holds it out.
    assert_eq!(
        merge_with(&pull_on(), coarse_cost(), &doc(false), &ctx(47.0)),
        (MergeReason::DecodeItl, 0)
    );
}

#[test]
fn with_deadline_pull_on_the_progress_rule_serves_short_prompts_only() {
    // Off (the default): a step without prefill takes progress_tokens (64) of any candidate.
    assert_eq!(
        merge_with(
            &MergeConfig::default(),
            coarse_cost(),
            &doc(false),
            &ctx(0.0)
        ),
        (MergeReason::Progress, 60)
    );
    let short = Candidate {
        lane: Lane::FastLane,
        min_tokens: 60,
        ..doc(false)
    };
    assert_eq!(
        merge_with(&pull_on(), coarse_cost(), &short, &ctx(0.0)),
        (MergeReason::Progress, 60)
    );
}

/// A chunk of a document at 12k context under a bound that fits a short chunk only: what a
/// backend with a wave floor (its floor coefficient as its attention's) makes of it.
fn trim_at_long_context(max_trim_cost: f64) -> (MergeReason, usize) {
    let cost = CostCoefficients {
        per_prefill_attn_pair_ms: 1e-5,
        per_prefill_floor_pair_ms: 1e-5,
        ..coarse_cost()
    };
    let cfg = MergeConfig {
        max_trim_cost,
        ..MergeConfig::default()
    };
    let mut draft = StepDraft::new();
    draft.add_decode(10, 200.0);
    draft.add_prefill(0, 8); // a prefill already in: no progress rule
    let b = Candidate {
        lane: Lane::LongStream,
        num_computed: 12_000,
        wanted: 512,
        min_tokens: 32,
        kv_blocks_needed: 0,
        due: false,
    };
    let d = should_merge(&CostModel::new(cost), &cfg, &draft, &b, &ctx(0.0));
    (d.reason, d.tokens)
}

#[test]
fn a_trim_into_the_wave_floor_waits_for_a_step_it_fits_whole() {
    // 512 tokens cost ~573 ms, any chunk at least ~61 ms of floor: 200 ms buys 137 tokens at
    // ~1.4 ms a token against ~1.1 for the whole chunk.
    let (reason, tokens) = trim_at_long_context(f64::INFINITY);
    assert_eq!(reason, MergeReason::Trimmed);
    assert!((100..200).contains(&tokens), "{tokens}");
    assert_eq!(trim_at_long_context(1.1), (MergeReason::DecodeItl, 0));
    assert_eq!(trim_at_long_context(2.0), (MergeReason::Trimmed, tokens));
}

#[test]
fn the_wave_floor_adds_pairs_only_to_short_chunks_behind_context() {
    let q = ATTN_FLOOR_QUERIES;
    assert_eq!(floor_pairs(64, 64), 0.0, "a whole prompt in one chunk");
    assert_eq!(floor_pairs(q, 10_000), 0.0, "a chunk at the floor");
    assert_eq!(
        floor_pairs(64, 10_000),
        prefill_pairs(q, 10_000) - prefill_pairs(64, 10_000)
    );
    // Context shorter than the floor: padded to the context only.
    assert_eq!(
        floor_pairs(64, 200),
        prefill_pairs(200, 200) - prefill_pairs(64, 200)
    );
}

/// Fits a backend `truth` from a prior whose floor coefficient is `prior_floor`: the fitted one.
fn fitted_floor(truth_floor: f64, prior_floor: f64) -> f64 {
    let truth = CostCoefficients {
        per_prefill_floor_pair_ms: truth_floor,
        ..CostCoefficients::default()
    };
    let prior = CostCoefficients {
        per_prefill_floor_pair_ms: prior_floor,
        ..CostCoefficients::default()
    };
    let mut model = CostModel::new(prior);
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    for _ in 0..600 {
        let mut f = StepFeatures::default();
        for _ in 0..rng.random_range(0..16) {
            f.add_seq(1, rng.random_range(1..8000));
        }
        if rng.random_bool(0.7) {
            let q = rng.random_range(16..1024);
            f.add_seq(q, q + rng.random_range(0..12_000));
        }
        let noise = 1.0 + 0.02 * (rng.random::<f64>() - 0.5);
        model.observe(&f, truth.predict_ms(&f) * noise);
    }
    model.coefficients().per_prefill_floor_pair_ms
}

#[test]
fn the_floor_coefficient_fits_a_kernel_with_or_without_the_floor() {
    let attn = CostCoefficients::default().per_prefill_attn_pair_ms;
    // Today's kernel (a floor as dear as attention) from a prior that halves it.
    let got = fitted_floor(attn, attn / 2.0);
    assert!((got - attn).abs() <= 0.1 * attn, "{got} against {attn}");
    // A split-KV kernel (no floor) from the same prior: toward 0.
    let got = fitted_floor(0.0, attn / 2.0);
    assert!(got <= 0.05 * attn, "{got}");
    // A prior of 0 says "no floor": held there whatever the steps show.
    assert_eq!(fitted_floor(attn, 0.0), 0.0);
}

/// `slack::prefill_merged_after` with a short e2e SLO: four short answers of 30 tokens (first
/// token after one step, then 3 decode steps, every step `step_s` long), then a 40-token medium
/// prompt; the tokens of it the next step takes (trimmed to any size: `min_chunk_tokens` 1).
fn merged_under_short_e2e(e2e_ms: f64, step_s: f64) -> usize {
    merged_under_short_e2e_with(e2e_ms, step_s, |_| {})
}

/// `merged_under_short_e2e` with one more knob set by `tweak`.
fn merged_under_short_e2e_with(
    e2e_ms: f64,
    step_s: f64,
    tweak: impl FnOnce(&mut SchedulerConfig),
) -> usize {
    let mut cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        max_num_batched_tokens: 256,
        long_prefill_token_threshold: 0,
        ..adaptive()
    };
    cfg.slo.short.e2e_ms = e2e_ms;
    cfg.merge.min_chunk_tokens = 1;
    tweak(&mut cfg);
    let mut e = Engine::new(cfg, 256);
    for id in 1..=4 {
        e.add(request(id).prompt_len(4).max_tokens(30).ignore_eos());
    }
    e.step_s = step_s;
    for _ in 0..4 {
        e.step();
    }
    super::slack::tokens_merged_for_a_new_prompt(&mut e)
}

#[test]
fn short_answers_pace_to_their_end_to_end_slo() {
    // No e2e SLO: 45 ms a token, 150 ms banked: the whole prompt (49 ms).
    assert_eq!(merged_under_short_e2e(f64::INFINITY, 0.01), 40);
    // 600 ms, at 40 ms with 26 tokens to go: 560 x 0.9 / 26 = 19.4 ms; 5 + 4 + n: 10 tokens.
    assert_eq!(merged_under_short_e2e(600.0, 0.01), 10);
}

#[test]
fn a_short_answer_behind_its_end_to_end_pace_catches_up() {
    // Four 40 ms steps (the pace is ~19 ms): at 160 ms, 440 x 0.9 / 26 = 15.2 ms: 6 tokens. A
    // fixed pace from the first token ((600 - 40) x 0.9 / 29 = 17.4 ms, floored there once
    // behind) would let 8 through and carry the delay to the last token.
    assert_eq!(merged_under_short_e2e(600.0, 0.04), 6);
    // Ahead (5 ms steps): at 20 ms, 580 x 0.9 / 26 = 20.1 ms: 11 tokens.
    assert_eq!(merged_under_short_e2e(600.0, 0.005), 11);
}

#[test]
fn the_end_to_end_pace_has_its_own_headroom() {
    let e2e_h = |h: f64| move |c: &mut SchedulerConfig| c.merge.e2e_headroom = Some(h);
    // 1.0 instead of itl_headroom's 0.9: 560 / 26 = 21.5 ms; 5 + 4 + n: 12 tokens (10 at 0.9).
    assert_eq!(merged_under_short_e2e_with(600.0, 0.01, e2e_h(1.0)), 12);
    // Set to itl_headroom's own value it changes nothing.
    assert_eq!(merged_under_short_e2e_with(600.0, 0.01, e2e_h(0.9)), 10);
    // It leaves the ITL pace alone: no e2e SLO, 45 ms a token and 150 ms banked as before.
    assert_eq!(
        merged_under_short_e2e_with(f64::INFINITY, 0.01, e2e_h(0.5)),
        40
    );
    // And the ITL headroom no longer scales the e2e pace once it is set: 560 x 1.0 / 26 still.
    let both = |c: &mut SchedulerConfig| {
        c.merge.e2e_headroom = Some(1.0);
        c.merge.itl_headroom = 0.8;
    };
    assert_eq!(merged_under_short_e2e_with(600.0, 0.01, both), 12);
}

/// Four short answers decoding 100 tokens each in 10 ms steps paced to 9 ms a token (e2e SLO
/// 1 s), so they never bank slack, and a 60-token long document (8 a step, TTFT SLO 400 ms)
/// arriving with them: the step its first chunk ran in, its TTFT (s) and the Deadline merges.
fn document_under_a_tight_pace(deadline_share: f64) -> (usize, f64, u64) {
    let mut cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        ..adaptive()
    };
    cfg.slo.short.e2e_ms = 1000.0;
    cfg.slo.long.ttft_ms = 400.0;
    cfg.merge.deadline_share = deadline_share;
    let mut e = Engine::new(cfg, 512);
    for id in 1..=4 {
        e.add(request(id).prompt_len(4).max_tokens(100).ignore_eos());
    }
    e.step_s = 0.01;
    e.step();
    e.add(request(9).prompt_len(60).max_tokens(2).ignore_eos());
    let mut first_chunk = None;
    let mut ttft = None;
    for step in 1..200 {
        let (out, updates) = e.step();
        if first_chunk.is_none() && scheduled(&out).iter().any(|&(id, _)| id == 9) {
            first_chunk = Some(step);
        }
        if ttft.is_none()
            && updates
                .iter()
                .any(|u| u.id.0 == 9 && !u.new_token_ids.is_empty())
        {
            ttft = Some(e.now() - 0.01);
        }
    }
    e.run_to_completion();
    e.assert_matches_reference();
    (
        first_chunk.expect("the document never ran"),
        ttft.expect("no first token"),
        e.sched.stats().merge_count(MergeReason::Deadline),
    )
}

#[test]
fn a_document_behind_a_tight_pace_is_pulled_by_its_deadline() {
    // Off: the progress rule puts 8 of its tokens in every step from its arrival.
    let (first, ttft, pulled) = document_under_a_tight_pace(f64::INFINITY);
    assert_eq!((first, pulled), (1, 0));
    assert!(ttft <= 0.4, "{ttft}");
    // On: it waits while the rest of its prefill (8 chunks of 17 ms predicted) needs under half
    // the time left, then goes in every step, and still meets its 400 ms.
    let (first, ttft, pulled) = document_under_a_tight_pace(0.5);
    assert!(first > 5, "pulled at step {first}");
    assert!(pulled >= 7, "{pulled} {first} {ttft}");
    assert!(ttft <= 0.4, "{ttft}");
}

#[test]
fn the_new_knobs_reject_bad_values_with_a_clear_error() {
    let bad = |f: fn(&mut SchedulerConfig)| {
        let mut cfg = adaptive();
        f(&mut cfg);
        cfg.validate().expect_err("accepted")
    };
    assert!(bad(|c| c.slo.short.e2e_ms = 100.0).contains("e2e_ms must exceed ttft_ms"));
    assert!(bad(|c| c.merge.e2e_headroom = Some(1.5)).contains("merge.e2e_headroom"));
    assert!(bad(|c| c.merge.e2e_headroom = Some(0.0)).contains("merge.e2e_headroom"));
    assert!(bad(|c| c.slo.long.e2e_ms = f64::NAN).contains("slo.long"));
    assert!(bad(|c| c.merge.deadline_share = 0.0).contains("deadline_share"));
    assert!(bad(|c| c.merge.max_trim_cost = 0.5).contains("max_trim_cost"));
    assert!(bad(|c| c.merge.doc_step_ms = 0.0).contains("doc_step_ms"));
    assert!(bad(|c| c.merge.doc_step_ms = f64::INFINITY).contains("doc_step_ms"));
    assert!(adaptive().validate().is_ok());
}
