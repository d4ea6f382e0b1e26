//! Exact verification of draft tokens (speculative decoding), so that the tokens a request gets
//! are distributed exactly as the target model alone would give them.
//!
//! - Greedy (`params.is_greedy()`): accept drafts while each equals the target's argmax at its
//!   position; the first mismatch is replaced by the argmax, and after k accepted drafts the
//!   argmax of the last row is the bonus token. The output is the non-speculative greedy output.
//! - Sampled (Leviathan et al. 2023, Chen et al. 2023): with p_j the target's distribution at
//!   position j and q_j the draft's (both after the request's temperature / top-k / top-p /
//!   min-p), draft d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)); the first
//!   rejection is replaced by a sample of the normalised residual max(0, p_j − q_j); after k
//!   accepted drafts the bonus token is sampled from p_k. A proposer without a model (n-gram
//!   lookup) proposes deterministically: q_j is a point mass on d_j, so d_j is accepted with
//!   probability p_j(d_j) and the residual is p_j without d_j — which is what keeping the plain
//!   sampler's own draw when it equals d_j gives, so that is how it is done: with a seed, the
//!   tokens are those of decoding without speculation, whatever the depth.
//!
//! Randomness: every draw comes from the request's (seed, output index) ChaCha stream, like the
//! plain sampler's (`sampler::draw_uniform`), at a fixed word offset per role (`Role`): the
//! token at output index i depends on the seed, the logits and the drafts, never on the batch.
//! The bonus token is an ordinary `Sampler::sample` at its index.
//!
//! p_j is the plain distribution: no penalties, logit bias or min_tokens mask (they would change
//! per position with the accepted drafts). Requests with those, or with logprobs, are never
//! given drafts (`SamplingParams::may_speculate`), so verification needs no token counts.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::sampling::params::SamplingParams;
use crate::sampling::sampler::{argmax, Sampled, Sampler};

/// What a draw is for; each role reads its own block of the (seed, output index) stream, so
/// the draft's sample, the acceptance test and the residual sample at one index are
/// independent. Role 0 (word 0) is the plain sampler's draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A draft model sampling its token at this index.
    Draft = 1,
    /// The acceptance test of the draft at this index.
    Accept = 2,
    /// The residual sample after a rejection at this index.
    Residual = 3,
}

/// Uniform in [0, 1) for `role` at `output_index` of the `seed` stream.
pub fn draw(seed: u64, output_index: usize, role: Role) -> f32 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(output_index as u64);
    // 16 words (one ChaCha block) per role.
    rng.set_word_pos(16 * role as u128);
    rng.random::<f32>()
}

/// The draft distribution behind a request's proposed tokens.
#[derive(Debug, Clone, Copy)]
pub enum DraftProbs<'a> {
    /// Proposed deterministically (n-gram lookup): a point mass on each draft.
    PointMass,
    /// Sampled from a draft model: row j (`vocab` floats) is q_j, the draft's distribution at
    /// draft j after the request's sampling params (`filtered_dense`), summing to 1.
    Dense(&'a [f32]),
}

/// The residual rule: writes the distribution to sample after draft `d` was rejected, given
/// p and the draft row (None: a point mass on `d`). A parameter only so the statistical test
/// can show that a wrong rule fails it.
/// What one request's verification reads.
#[derive(Debug, Clone, Copy)]
pub struct Verify<'a> {
    /// `[k + 1, vocab]` row-major: row j predicts the token at output index `output_index + j`.
    pub logits: &'a [f32],
    pub vocab: usize,
    /// The k proposed tokens.
    pub drafts: &'a [u32],
    /// The draft's distributions the tokens were drawn from.
    pub q: DraftProbs<'a>,
    pub params: &'a SamplingParams,
    pub seed: u64,
    pub output_index: usize,
}

type ResidualFn = fn(p: &[f32], q: Option<&[f32]>, d: u32, out: &mut Vec<f32>);

/// max(0, p − q), unnormalised.
fn exact_residual(p: &[f32], q: Option<&[f32]>, d: u32, out: &mut Vec<f32>) {
    out.clear();
    match q {
        Some(q) => out.extend(p.iter().zip(q).map(|(p, q)| (p - q).max(0.0))),
        None => {
            out.extend_from_slice(p);
            out[d as usize] = 0.0;
        }
    }
}

/// Verifies drafts against the target's logits; reusable scratch.
#[derive(Debug, Default)]
pub struct RejectionSampler {
    sampler: Sampler,
    p: Vec<f32>,
    residual: Vec<f32>,
}

impl RejectionSampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Verifies `v.drafts` (k tokens) with the target's logits at the k + 1 positions that
    /// computed them. Pushes the accepted drafts and then the target's own token to `out`
    /// (1..=k + 1 tokens, logprobs under the unmodified target distribution) and returns how
    /// many drafts were accepted.
    pub fn verify(&mut self, v: Verify<'_>, out: &mut Vec<Sampled>) -> usize {
        self.verify_with(v, out, exact_residual)
    }

    fn verify_with(
        &mut self,
        v: Verify<'_>,
        out: &mut Vec<Sampled>,
        residual: ResidualFn,
    ) -> usize {
        let Verify {
            logits,
            vocab,
            drafts,
            q,
            params,
            seed,
            output_index,
        } = v;
        let k = drafts.len();
        assert_eq!(logits.len(), (k + 1) * vocab, "one row per draft, plus one");
        if let DraftProbs::Dense(rows) = q {
            assert_eq!(rows.len(), k * vocab, "one draft row per draft");
        }
        let row = |j: usize| &logits[j * vocab..(j + 1) * vocab];
        for (j, &d) in drafts.iter().enumerate() {
            let logits_j = row(j);
            if params.is_greedy() {
                let (best, max) = argmax(logits_j);
                out.push(Sampled {
                    token: best,
                    logprob: max - log_sum_exp(logits_j, max),
                });
                if best != d {
                    return j;
                }
                continue;
            }
            let q_row = match q {
                DraftProbs::PointMass => {
                    // Accept with probability p(d), else the residual p without d: exactly the
                    // plain sampler's draw at this index, kept when it equals the draft. So a
                    // deterministic proposer changes no seeded token, at any depth.
                    let x = self
                        .sampler
                        .sample(logits_j, params, seed, output_index + j, None);
                    out.push(x);
                    if x.token != d {
                        return j;
                    }
                    continue;
                }
                DraftProbs::Dense(rows) => &rows[j * vocab..(j + 1) * vocab],
            };
            filtered_dense(&mut self.sampler, logits_j, params, &mut self.p);
            let q_d = q_row[d as usize];
            let u = draw(seed, output_index + j, Role::Accept);
            // u < p/q without the division (q_d may be tiny).
            if u * q_d < self.p[d as usize] {
                out.push(with_logprob(logits_j, d));
                continue;
            }
            residual(&self.p, Some(q_row), d, &mut self.residual);
            let u = draw(seed, output_index + j, Role::Residual);
            // p == q leaves no residual mass, but then nothing is rejected; rounding aside.
            let token = sample_dense(&self.residual, u).unwrap_or_else(|| {
                sample_dense(&self.p, u).expect("a filtered distribution keeps a token")
            });
            out.push(with_logprob(logits_j, token));
            return j;
        }
        // Every draft accepted: the bonus token, an ordinary sample at its index.
        out.push(
            self.sampler
                .sample(row(k), params, seed, output_index + k, None),
        );
        k
    }
}

/// The distribution `params` make of a row of logits (temperature, top-k, top-p, min-p, as
/// `Sampler::sample` applies them), dense over the vocabulary and summing to 1. Greedy params
/// give a point mass on the argmax.
pub fn filtered_dense(
    sampler: &mut Sampler,
    logits: &[f32],
    params: &SamplingParams,
    out: &mut Vec<f32>,
) {
    out.clear();
    out.resize(logits.len(), 0.0);
    let (best, max) = argmax(logits);
    if params.is_greedy() {
        out[best as usize] = 1.0;
        return;
    }
    let kept = sampler.filtered_probs(logits, params, max);
    let total: f32 = kept.iter().map(|c| c.1).sum();
    for &(t, p) in kept {
        out[t as usize] = p / total;
    }
}

/// Inverse-CDF draw from an unnormalised dense distribution in token-id order; None when it
/// has no mass.
pub fn sample_dense(weights: &[f32], u: f32) -> Option<u32> {
    let total: f32 = weights.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let mut target = u * total;
    let mut last = None;
    for (t, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            if target < w {
                return Some(t as u32);
            }
            target -= w;
            last = Some(t as u32);
        }
    }
    // Rounding left the draw past the end: the last token with mass.
    last
}

fn with_logprob(logits: &[f32], token: u32) -> Sampled {
    let (_, max) = argmax(logits);
    Sampled {
        token,
        logprob: logits[token as usize] - log_sum_exp(logits, max),
    }
}

fn log_sum_exp(xs: &[f32], max: f32) -> f32 {
    max + xs.iter().map(|&x| (x - max).exp()).sum::<f32>().ln()
}

#[cfg(test)]
mod tests;
