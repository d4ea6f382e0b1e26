//! Speculation in the core, with a scripted executor: draft positions reserved, verified tokens
//! folded in, rejected positions' blocks released, and the adaptive depth backing off and
//! retrying.

use std::time::Duration;

use super::*;
use crate::scheduler::spec::MIN_FIT_STEPS;
use crate::spec::{SpecConfig, SpecMethod};
use crate::step::{DraftOutcome, SampledToken};

/// Plays the executor for one step: each sampled request gets `accept(drafts)` of its drafts
/// accepted plus one token; the step costs 10 ms plus 4 ms per draft position verified.
fn execute(out: &SchedulerOutput, step_no: u32, accept: impl Fn(usize) -> usize) -> StepOutput {
    let mut step = StepOutput::default();
    let mut rows = 0;
    for s in out.scheduled.iter().filter(|s| s.sample) {
        let k = s.num_draft_tokens;
        let a = accept(k).min(k);
        for j in 0..=a {
            step.sampled.push(SampledToken {
                request_id: s.id,
                token: RESERVED + 1000 + step_no * 8 + j as u32,
                logprob: 0.0,
            });
        }
        if k > 0 {
            step.spec.drafts.push(DraftOutcome {
                request_id: s.id,
                proposed: k,
                accepted: a,
            });
        }
        rows += k;
    }
    step.elapsed = Duration::from_micros(10_000 + 4_000 * rows as u64);
    step
}

fn spec_cfg() -> SpecConfig {
    SpecConfig {
        method: SpecMethod::Ngram,
        max_depth: 4,
        ..SpecConfig::default()
    }
}

fn long_params(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Runs `steps` steps of one request; returns the draft positions each step reserved.
fn run(accept: impl Fn(usize) -> usize + Copy, steps: u32) -> Vec<usize> {
    run_with(long_params(400), accept, steps)
}

/// `run`, for a request with `params`.
fn run_with(
    params: SamplingParams,
    accept: impl Fn(usize) -> usize + Copy,
    steps: u32,
) -> Vec<usize> {
    let mut core = Scheduler::new(config()).with_speculation(spec_cfg());
    let mut kv = KvCacheManager::new(256, BLOCK_SIZE, true);
    let req = NewRequest {
        params: Arc::new(params),
        ..request(1)
    };
    core.add_request(req, 0.0);
    let mut depths = Vec::new();
    let mut known = 13;
    for n in 0..steps {
        let t = n as f64 * 0.01;
        let out = core.schedule(&mut kv, t);
        depths.push(out.total_num_draft_tokens());
        let step = execute(&out, n, accept);
        for u in core.update_from_output(&out, &step, &mut kv, t) {
            known += u.new_token_ids.len();
        }
        // Rollback: never a block past the known tokens.
        let held = kv.block_table(RequestId(1)).len();
        assert!(
            held <= usize::div_ceil(known, BLOCK_SIZE),
            "step {n}: {held} blocks, {known} tokens"
        );
    }
    depths
}

#[test]
fn accepted_drafts_are_kept_and_rejected_positions_release_their_blocks() {
    let all = run(|k| k, 40);
    assert!(all.iter().filter(|&&k| k == 4).count() > 20, "{all:?}");
    let half = run(|k| k / 2, 40);
    assert!(half.iter().any(|&k| k > 0), "{half:?}");
}

#[test]
fn a_request_whose_drafts_always_fail_backs_off_and_is_retried() {
    let depths = run(|_| 0, 400);
    let spec_steps = |r: std::ops::Range<usize>| depths[r].iter().filter(|&&k| k > 0).count();
    // It backs off: most steps after the first failures carry no drafts...
    assert!(spec_steps(50..400) < 100, "{depths:?}");
    // ...but it is tried again now and then, not held at 0 for good.
    assert!(spec_steps(200..400) > 0, "{depths:?}");
}

#[test]
fn requests_with_penalties_bias_min_tokens_or_logprobs_never_get_drafts() {
    // Every draft accepted: a plain request speculates at full depth...
    assert!(run_with(long_params(100), |k| k, 40).contains(&4));
    // ...one with any of these never does (verification samples the plain distribution).
    let base = long_params(100);
    let cases = [
        SamplingParams {
            presence_penalty: 0.5,
            ..base.clone()
        },
        SamplingParams {
            frequency_penalty: -0.5,
            ..base.clone()
        },
        SamplingParams {
            repetition_penalty: 1.2,
            ..base.clone()
        },
        SamplingParams {
            logit_bias: vec![(7, 3.0)],
            ..base.clone()
        },
        SamplingParams {
            min_tokens: 5,
            min_tokens_blocked: vec![2],
            ..base.clone()
        },
        SamplingParams {
            logprobs: Some(0),
            ..base.clone()
        },
        SamplingParams {
            speculative: false,
            ..base.clone()
        },
    ];
    for p in cases {
        assert!(!p.may_speculate(), "{p:?}");
        let depths = run_with(p.clone(), |k| k, 40);
        assert!(depths.iter().all(|&k| k == 0), "{p:?}: {depths:?}");
    }
}

#[test]
fn choices_forked_off_one_prompt_never_get_drafts() {
    let mut core = Scheduler::new(config()).with_speculation(spec_cfg());
    let mut kv = KvCacheManager::new(256, BLOCK_SIZE, true);
    // Choices 1, 2, 3 share the prompt's blocks (copy-on-write); request 10 is on its own.
    let forked = NewRequest {
        params: Arc::new(long_params(60)),
        n: 3,
        ..request(1)
    };
    let alone = NewRequest {
        params: Arc::new(long_params(60)),
        ..request(10)
    };
    core.add_request(forked, 0.0);
    core.add_request(alone, 0.0);
    let mut drafts: HashMap<u64, usize> = HashMap::new();
    for n in 0..80 {
        let t = n as f64 * 0.01;
        let out = core.schedule(&mut kv, t);
        for s in &out.scheduled {
            *drafts.entry(s.id.0).or_default() += s.num_draft_tokens;
        }
        let step = execute(&out, n, |k| k);
        core.update_from_output(&out, &step, &mut kv, t);
    }
    assert!(drafts[&10] > 0, "{drafts:?}");
    for id in 1..=3 {
        assert_eq!(drafts.get(&id), Some(&0), "choice {id}: {drafts:?}");
    }
}

/// Until the draft model's cost is measured, one decode per step probes it at the ceiling and
/// the others get no drafts, even where the cost model (a zero draft cost, cheap rows) would
/// send them all; then the cost model decides.
#[test]
fn an_unmeasured_draft_model_is_probed_by_one_decode_per_step() {
    let cfg = SpecConfig {
        method: SpecMethod::Draft,
        max_depth: 3,
        ..SpecConfig::default()
    };
    let mut core = Scheduler::new(config()).with_speculation(cfg);
    let mut kv = KvCacheManager::new(256, BLOCK_SIZE, true);
    for id in 1..=3 {
        let req = NewRequest {
            params: Arc::new(long_params(200)),
            ..request(id)
        };
        core.add_request(req, 0.0);
    }
    let mut drafting_steps = 0;
    for n in 0..40u32 {
        let t = n as f64 * 0.01;
        let out = core.schedule(&mut kv, t);
        let ks: Vec<usize> = out
            .scheduled
            .iter()
            .filter(|s| s.sample)
            .map(|s| s.num_draft_tokens)
            .collect();
        let drafting = ks.iter().filter(|&&k| k > 0).count();
        if (drafting_steps as u64) < MIN_FIT_STEPS && drafting > 0 {
            assert_eq!(drafting, 1, "step {n}: {ks:?}");
            assert!(
                ks.contains(&3),
                "step {n}: the probe drafts at the ceiling: {ks:?}"
            );
        }
        // Every row is accepted, and rows (1 ms, against 10 ms for the step) and the draft
        // cost little: after the probe, all speculate.
        let mut step = execute(&out, n, |k| k);
        step.elapsed = Duration::from_micros(10_000 + 1_000 * ks.iter().sum::<usize>() as u64);
        if drafting > 0 {
            drafting_steps += 1;
            step.spec.passes = *ks.iter().max().unwrap();
            step.spec.tokens = ks.iter().sum();
            step.spec.elapsed = Duration::from_micros(100 * step.spec.tokens as u64);
        }
        core.update_from_output(&out, &step, &mut kv, t);
        if drafting_steps as u64 > MIN_FIT_STEPS + 5 {
            assert_eq!(drafting, 3, "step {n}: {ks:?}");
        }
    }
    assert!(
        drafting_steps as u64 > MIN_FIT_STEPS + 5,
        "{drafting_steps}"
    );
}

/// Runs `n` requests for `steps` steps; step `s` accepts `accept(s, drafts)` of each request's
/// drafts, and costs 1 ms plus 1 ms per decode and `row_us` per verification row. With
/// `draft_us` a draft model proposes (the `Draft` method), costing that per pass and per draft
/// token. Returns the draft positions each step reserved.
fn run_phased(
    n: u64,
    row_us: u64,
    draft_us: Option<u64>,
    accept: impl Fn(u32, usize) -> usize,
    steps: u32,
) -> Vec<usize> {
    run_phased_fixed(n, 0, row_us, draft_us, accept, steps, 0)
}

/// As `run_phased`, a step with drafts costing `fixed_us` more once (the CPU's jump from the
/// one-row decode path to a multi-row step); with `spike_every` > 0 every such step without
/// drafts takes 10 times as long (preempted by the OS).
fn run_phased_fixed(
    n: u64,
    fixed_us: u64,
    row_us: u64,
    draft_us: Option<u64>,
    accept: impl Fn(u32, usize) -> usize,
    steps: u32,
    spike_every: u32,
) -> Vec<usize> {
    let config = SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 2048,
        ..config()
    };
    let cfg = SpecConfig {
        method: match draft_us {
            Some(_) => SpecMethod::Draft,
            None => SpecMethod::Ngram,
        },
        ..spec_cfg()
    };
    let mut core = Scheduler::new(config).with_speculation(cfg);
    let mut kv = KvCacheManager::new(4096, BLOCK_SIZE, true);
    for id in 1..=n {
        let req = NewRequest {
            params: Arc::new(long_params(400)),
            ..request(id)
        };
        core.add_request(req, 0.0);
    }
    let mut depths = Vec::new();
    for s in 0..steps {
        let t = s as f64 * 0.01;
        let out = core.schedule(&mut kv, t);
        let ks: Vec<usize> = out.scheduled.iter().map(|x| x.num_draft_tokens).collect();
        depths.push(ks.iter().sum());
        let mut step = execute(&out, s, |k| accept(s, k));
        let decodes = out.scheduled.iter().filter(|x| x.sample).count() as u64;
        let rows: u64 = ks.iter().sum::<usize>() as u64;
        let mut us = 1_000 * (1 + decodes) + row_us * rows;
        if rows > 0 {
            us += fixed_us;
        } else if spike_every > 0 && s % spike_every == 0 && s > 20 {
            us *= 10;
        }
        if let (Some(d), true) = (draft_us, rows > 0) {
            step.spec.passes = *ks.iter().max().unwrap();
            step.spec.tokens = rows as usize;
            step.spec.elapsed = Duration::from_micros(d * (step.spec.passes as u64 + rows));
            us += d * (step.spec.passes as u64 + rows);
        }
        step.elapsed = Duration::from_micros(us);
        core.update_from_output(&out, &step, &mut kv, t);
    }
    depths
}

/// Acceptance that changes over a run (the CPU pair at temperature 0.7: hardly any draft
/// accepted for the first tokens, nearly all after).
fn hard_start(s: u32, k: usize) -> usize {
    if s < 60 {
        0
    } else {
        k
    }
}

/// Steps in `r` that carried drafts.
fn spec_steps(depths: &[usize], r: std::ops::Range<usize>) -> usize {
    depths[r].iter().filter(|&&k| k > 0).count()
}

/// The request held at depth 0 through the hard start is probed again and speculates through
/// the second phase, not only a step in 25.
#[test]
fn a_request_held_through_a_hard_start_speculates_once_its_text_turns_predictable() {
    let depths = run_phased(1, 1_000, None, hard_start, 160);
    // Held through the first phase (its probes back off)...
    assert!(spec_steps(&depths, 30..60) < 10, "{depths:?}");
    // ...and drafting nearly every step of the second (within a back-off interval of its
    // start; the request's 400 tokens run out at about step 150).
    assert!(spec_steps(&depths, 100..140) > 35, "{depths:?}");
}

/// The same with a draft model, whose catch-up over the held request's tokens grows with the
/// hold (≈ 50 tokens at 0.1 ms each by step 60, more than the probe could win in one step):
/// the probe is still taken, its catch-up priced per held step.
#[test]
fn a_long_hold_does_not_price_the_draft_models_probe_out() {
    let depths = run_phased(1, 250, Some(100), hard_start, 160);
    assert!(spec_steps(&depths, 30..60) < 10, "{depths:?}");
    assert!(spec_steps(&depths, 100..140) > 35, "{depths:?}");
}

/// Batch 32, where a verification row costs a decode's time: the back-off makes requests due,
/// but the cost model prices even an optimistic probe out, so after the warm-up the batch
/// drafts nothing (probing costs nothing there).
#[test]
fn due_probes_are_priced_out_at_a_large_batch() {
    let depths = run_phased(32, 1_000, None, hard_start, 160);
    let late: usize = depths[40..].iter().sum();
    assert_eq!(late, 0, "{depths:?}");
}

/// A step with drafts costs 3.5 ms once more (a decode step 2 ms, rows 0.1 ms): drafting pays
/// at acceptance 1 but not at the prior (0.7), so a request held through the hard start must
/// be probed at the optimistic rate, or it is never drafted for again.
#[test]
fn a_fixed_verification_cost_does_not_stop_the_probes() {
    let depths = run_phased_fixed(1, 3_500, 100, None, hard_start, 160, 0);
    assert!(spec_steps(&depths, 30..60) < 10, "{depths:?}");
    assert!(spec_steps(&depths, 100..140) > 20, "{depths:?}");
}

/// The same costs with acceptance 0.5 throughout: speculation never pays, and after the
/// warm-up only the back-off's probes (at most `PROBE_DEPTH` rows, spaced out) draft.
#[test]
fn a_fixed_verification_cost_holds_mediocre_acceptance_at_depth_zero() {
    let depths = run_phased_fixed(1, 3_500, 100, None, |_, k| k / 2, 160, 0);
    let late = spec_steps(&depths, 40..160);
    assert!(late <= 12, "{late}: {depths:?}");
    assert!(depths[40..].iter().all(|&k| k <= 2), "{depths:?}");
}

/// As above, with every 7th step without drafts preempted (10 times as long): the spikes are
/// left out of the step-time fit, so they do not make not speculating look dear.
#[test]
fn preempted_steps_do_not_talk_the_policy_into_drafting() {
    let depths = run_phased_fixed(1, 3_500, 100, None, |_, k| k / 2, 160, 7);
    let late = spec_steps(&depths, 40..160);
    assert!(late <= 12, "{late}: {depths:?}");
}

/// With a draft model whose cost is not yet measured, a request whose drafts keep being
/// rejected stops probing that cost at the ceiling every step: it is held (and probed again by
/// the back-off), so the hard start costs a few drafting steps, not `MIN_FIT_STEPS`.
#[test]
fn the_draft_cost_probe_holds_a_request_whose_drafts_are_rejected() {
    let depths = run_phased(1, 250, Some(100), hard_start, 160);
    let early = spec_steps(&depths, 0..60);
    assert!(early <= 5, "{early}: {depths:?}");
    // The cost is still measured, later, and the request speculates once its text allows.
    assert!(spec_steps(&depths, 100..140) > 30, "{depths:?}");
}
