//! The statistical test of exact sampling: speculative decoding of a toy target/draft pair must
//! give the target's distribution over its first three tokens (chi-square over 20k seeded
//! samples), and the same test must reject a wrong residual rule.

use std::hash::{DefaultHasher, Hash, Hasher};

use super::*;

const VOCAB: usize = 6;
const SAMPLES: usize = 20_000;
const PROMPT: &[u32] = &[3, 1];

fn unit(parts: impl Hash) -> f32 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    (h.finish() % 10_000) as f32 / 10_000.0
}

/// The toy target: logits in [-2, 2) from a hash of the context.
fn target_logits(ctx: &[u32]) -> Vec<f32> {
    (0..VOCAB)
        .map(|t| unit((ctx, t, "p")) * 4.0 - 2.0)
        .collect()
}

/// The toy draft: correlated with the target, but not equal to it.
fn draft_logits(ctx: &[u32]) -> Vec<f32> {
    target_logits(ctx)
        .iter()
        .enumerate()
        .map(|(t, l)| 0.5 * l + unit((ctx, t, "q")) * 3.0 - 1.5)
        .collect()
}

fn params() -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 5,
        ..SamplingParams::default()
    }
}

/// How drafts are made.
#[derive(Clone, Copy)]
enum Proposer {
    /// Sampled from the draft's filtered distribution (a draft model).
    Sampled,
    /// The draft's argmax, proposed as a point mass (a deterministic proposer, like n-gram).
    Deterministic,
}

/// The first three tokens of one seeded request, decoded speculatively with depth `k` per round
/// (each round: propose k drafts, verify them with the target's k + 1 rows).
fn speculative_three(
    seed: u64,
    k: usize,
    proposer: Proposer,
    rs: &mut RejectionSampler,
    residual: ResidualFn,
) -> [u32; 3] {
    let p = params();
    let mut sampler = Sampler::new();
    let mut q = Vec::new();
    let mut ctx = PROMPT.to_vec();
    let mut out: Vec<u32> = Vec::new();
    while out.len() < 3 {
        let idx = out.len();
        let mut drafts = Vec::new();
        let mut q_rows = Vec::new();
        for j in 0..k {
            let mut c = ctx.clone();
            c.extend(&drafts);
            let dl = draft_logits(&c);
            let d = match proposer {
                Proposer::Sampled => {
                    filtered_dense(&mut sampler, &dl, &p, &mut q);
                    q_rows.extend_from_slice(&q);
                    sample_dense(&q, draw(seed, idx + j, Role::Draft)).unwrap()
                }
                Proposer::Deterministic => argmax(&dl).0,
            };
            drafts.push(d);
        }
        let mut logits = Vec::new();
        for j in 0..=k {
            let mut c = ctx.clone();
            c.extend(&drafts[..j]);
            logits.extend(target_logits(&c));
        }
        let probs = match proposer {
            Proposer::Sampled => DraftProbs::Dense(&q_rows),
            Proposer::Deterministic => DraftProbs::PointMass,
        };
        let mut verified = Vec::new();
        let v = Verify {
            logits: &logits,
            vocab: VOCAB,
            drafts: &drafts,
            q: probs,
            params: &p,
            seed,
            output_index: idx,
        };
        let accepted = rs.verify_with(v, &mut verified, residual);
        assert_eq!(verified.len(), accepted + 1);
        assert_eq!(
            &verified[..accepted]
                .iter()
                .map(|s| s.token)
                .collect::<Vec<_>>()[..],
            &drafts[..accepted]
        );
        for s in verified {
            ctx.push(s.token);
            out.push(s.token);
        }
    }
    [out[0], out[1], out[2]]
}

/// The target's exact probability of each first-three-token sequence (index x0·V² + x1·V + x2).
fn exact_distribution() -> Vec<f64> {
    let p = params();
    let mut sampler = Sampler::new();
    let mut dense = Vec::new();
    let mut dist = |ctx: &[u32]| -> Vec<f64> {
        filtered_dense(&mut sampler, &target_logits(ctx), &p, &mut dense);
        dense.iter().map(|&x| x as f64).collect()
    };
    let mut out = vec![0.0; VOCAB.pow(3)];
    let p0 = dist(PROMPT);
    for a in 0..VOCAB {
        let ctx1 = [PROMPT, &[a as u32]].concat();
        let p1 = dist(&ctx1);
        for b in 0..VOCAB {
            let ctx2 = [&ctx1[..], &[b as u32]].concat();
            let p2 = dist(&ctx2);
            for c in 0..VOCAB {
                out[(a * VOCAB + b) * VOCAB + c] = p0[a] * p1[b] * p2[c];
            }
        }
    }
    out
}

/// Pearson's statistic over cells with an expected count of at least 5 (the rest pooled into
/// one cell), and its degrees of freedom.
fn chi_square(observed: &[u64], expected_p: &[f64], n: usize) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0);
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    for (&o, &p) in observed.iter().zip(expected_p) {
        let e = p * n as f64;
        if e >= 5.0 {
            stat += (o as f64 - e).powi(2) / e;
            cells += 1;
        } else {
            pooled_o += o as f64;
            pooled_e += e;
        }
    }
    if pooled_e > 0.0 {
        stat += (pooled_o - pooled_e).powi(2) / pooled_e;
        cells += 1;
    }
    (stat, cells - 1)
}

/// The chi-square distribution's 0.999 quantile (Wilson–Hilferty).
fn critical_999(dof: usize) -> f64 {
    let v = dof as f64;
    let z = 3.090_232;
    v * (1.0 - 2.0 / (9.0 * v) + z * (2.0 / (9.0 * v)).sqrt()).powi(3)
}

fn statistic(proposer: Proposer, residual: ResidualFn) -> (f64, f64) {
    let want = exact_distribution();
    let mut rs = RejectionSampler::new();
    let mut counts = vec![0u64; want.len()];
    for seed in 0..SAMPLES as u64 {
        // Depths 1 to 3, so rounds end at every position of the three tokens.
        let k = 1 + (seed % 3) as usize;
        let [a, b, c] = speculative_three(seed, k, proposer, &mut rs, residual);
        counts[(a as usize * VOCAB + b as usize) * VOCAB + c as usize] += 1;
    }
    let (stat, dof) = chi_square(&counts, &want, SAMPLES);
    (stat, critical_999(dof))
}

/// Resamples from the target after a rejection: a plausible bug, which over-weights the tokens
/// the draft likes.
fn wrong_residual(p: &[f32], _q: Option<&[f32]>, _d: u32, out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(p);
}

#[test]
fn sampled_drafts_give_the_target_distribution_and_a_wrong_residual_does_not() {
    let (stat, crit) = statistic(Proposer::Sampled, exact_residual);
    assert!(
        stat < crit,
        "exact residual: chi-square {stat:.1} >= {crit:.1}"
    );
    let (bad, crit) = statistic(Proposer::Sampled, wrong_residual);
    assert!(
        bad > crit,
        "wrong residual passed: chi-square {bad:.1} < {crit:.1}"
    );
}

#[test]
fn point_mass_drafts_give_exactly_the_plain_samplers_tokens() {
    let (stat, crit) = statistic(Proposer::Deterministic, exact_residual);
    assert!(stat < crit, "chi-square {stat:.1} >= {crit:.1}");
    // Stronger: token for token what sampling without speculation gives with the same seed,
    // at every depth.
    let p = params();
    let mut sampler = Sampler::new();
    let mut rs = RejectionSampler::new();
    let (mut differ_from_draft, mut n) = (0, 0);
    for seed in 0..3000u64 {
        let mut ctx = PROMPT.to_vec();
        for i in 0..3 {
            let t = sampler
                .sample(&target_logits(&ctx), &p, seed, i, None)
                .token;
            differ_from_draft += (t != argmax(&draft_logits(&ctx)).0) as usize;
            n += 1;
            ctx.push(t);
        }
        let plain = [ctx[2], ctx[3], ctx[4]];
        let k = 1 + (seed % 3) as usize;
        let spec = speculative_three(seed, k, Proposer::Deterministic, &mut rs, exact_residual);
        assert_eq!(spec, plain, "seed {seed}, depth {k}");
    }
    // Both accepted and rejected drafts occurred.
    assert!(differ_from_draft > n / 10 && differ_from_draft < n * 9 / 10);
}

#[test]
fn greedy_accepts_while_drafts_equal_the_argmax_then_corrects() {
    // Rows' argmaxes: 2, 4, 1.
    let mut logits = vec![0.0f32; 3 * VOCAB];
    logits[2] = 3.0;
    logits[VOCAB + 4] = 3.0;
    logits[2 * VOCAB + 1] = 3.0;
    let greedy = SamplingParams::greedy(8);
    let mut rs = RejectionSampler::new();
    let run = |rs: &mut RejectionSampler, drafts: &[u32]| {
        let mut out = Vec::new();
        let v = Verify {
            logits: &logits,
            vocab: VOCAB,
            drafts,
            q: DraftProbs::PointMass,
            params: &greedy,
            seed: 1,
            output_index: 0,
        };
        let n = rs.verify(v, &mut out);
        (n, out.iter().map(|s| s.token).collect::<Vec<_>>())
    };
    assert_eq!(
        run(&mut rs, &[2, 4]),
        (2, vec![2, 4, 1]),
        "all accepted, bonus"
    );
    assert_eq!(run(&mut rs, &[2, 5]), (1, vec![2, 4]), "second corrected");
    assert_eq!(run(&mut rs, &[0, 4]), (0, vec![2]), "first corrected");
}

#[test]
fn same_seed_same_tokens_and_draws_differ_by_role() {
    let mut rs = RejectionSampler::new();
    let a = speculative_three(42, 2, Proposer::Sampled, &mut rs, exact_residual);
    let b = speculative_three(42, 2, Proposer::Sampled, &mut rs, exact_residual);
    assert_eq!(a, b);
    let roles = [Role::Draft, Role::Accept, Role::Residual];
    let draws: Vec<f32> = roles.iter().map(|&r| draw(7, 3, r)).collect();
    assert!(draws[0] != draws[1] && draws[1] != draws[2]);
    assert_ne!(draws[0], crate::sampling::sampler::draw_uniform(7, 3));
}

#[test]
fn a_rejection_never_returns_the_rejected_point_mass_draft() {
    // p puts 0.5 on token 0; a point-mass draft of token 0 is rejected half the time, and the
    // residual then excludes it.
    let logits = [
        0.0f32, -30.0, 0.0, -30.0, -30.0, -30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    ];
    let p = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let mut rs = RejectionSampler::new();
    let mut rejected = 0;
    for seed in 0..2000 {
        let mut out = Vec::new();
        let v = Verify {
            logits: &logits,
            vocab: VOCAB,
            drafts: &[0],
            q: DraftProbs::PointMass,
            params: &p,
            seed,
            output_index: 0,
        };
        if rs.verify(v, &mut out) == 0 {
            rejected += 1;
            assert_eq!(
                out[0].token, 2,
                "the residual holds token 2 only (up to e^-30)"
            );
        }
    }
    assert!((800..1200).contains(&rejected), "{rejected}");
}
