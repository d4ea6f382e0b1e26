//! Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p, seeded.
//!
//! The random draw for output token `i` of a request comes from a ChaCha stream keyed by
//! (seed, i), so a seeded request gives the same tokens whatever shares its batch and after a
//! preemption recomputes it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::sampling::params::SamplingParams;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Log-probability of the token under the unmodified (temperature 1) distribution.
    pub logprob: f32,
}

/// The seed of choice `index` of a request with `n > 1` (parallel sampling): choice 0 keeps the
/// request's seed, so `n = 1` is unchanged; the others get distinct streams, a function of
/// (seed, index) alone, so a choice's tokens depend only on (seed, sample index, output index).
pub fn sample_seed(seed: u64, index: usize) -> u64 {
    if index == 0 {
        return seed;
    }
    // SplitMix64's finalizer over the pair: distinct indices give unrelated seeds.
    let mut z = seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Reusable scratch so sampling does not allocate per token.
#[derive(Debug, Default)]
pub struct Sampler {
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Samples one token. `logits` has the vocabulary's length.
    pub fn sample(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        seed: u64,
        output_index: usize,
    ) -> Sampled {
        let (argmax, max_logit) = argmax(logits);
        let log_z = log_sum_exp(logits, max_logit);
        if params.is_greedy() {
            return Sampled {
                token: argmax,
                logprob: max_logit - log_z,
            };
        }
        let probs = self.filtered_probs(logits, params, max_logit);
        let u: f32 = draw_uniform(seed, output_index);
        let total: f32 = probs.iter().map(|c| c.1).sum();
        let mut target = u * total;
        let mut token = probs.last().map(|c| c.0).unwrap_or(argmax);
        for &(t, p) in probs.iter() {
            if target < p {
                token = t;
                break;
            }
            target -= p;
        }
        Sampled {
            token,
            logprob: logits[token as usize] - log_z,
        }
    }

    /// Candidates after temperature, top-k, top-p and min-p, as (token, unnormalised prob),
    /// sorted by probability, highest first.
    pub fn filtered_probs(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        max_logit: f32,
    ) -> &[(u32, f32)] {
        let inv_t = 1.0 / params.temperature.max(1e-5);
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, ((l - max_logit) * inv_t).exp())),
        );
        let by_prob_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if params.top_k > 0 && params.top_k < cands.len() {
            cands.select_nth_unstable_by(params.top_k - 1, by_prob_desc);
            cands.truncate(params.top_k);
        }
        cands.sort_unstable_by(by_prob_desc);
        if params.min_p > 0.0 {
            // The top candidate has probability 1 before normalisation (its logit is the max).
            let cut = params.min_p * cands[0].1;
            let keep = cands.iter().take_while(|c| c.1 >= cut).count().max(1);
            cands.truncate(keep);
        }
        if params.top_p < 1.0 {
            let total: f32 = cands.iter().map(|c| c.1).sum();
            let mut acc = 0.0;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                acc += c.1 / total;
                if acc >= params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
        }
        cands
    }
}

/// Uniform in [0, 1) from the (seed, index) stream.
pub fn draw_uniform(seed: u64, output_index: usize) -> f32 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(output_index as u64);
    rng.random::<f32>()
}

pub fn argmax(xs: &[f32]) -> (u32, f32) {
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, &x) in xs.iter().enumerate() {
        if x > best.1 {
            best = (i as u32, x);
        }
    }
    best
}

fn log_sum_exp(xs: &[f32], max: f32) -> f32 {
    max + xs.iter().map(|&x| (x - max).exp()).sum::<f32>().ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_seeds_keep_choice_zero_and_differ_per_index() {
        assert_eq!(sample_seed(42, 0), 42);
        let seeds: std::collections::HashSet<u64> =
            (0..64).map(|i| sample_seed(42, i)).collect();
        assert_eq!(seeds.len(), 64);
        assert_ne!(sample_seed(42, 1), sample_seed(43, 1));
    }

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        f(&mut p);
        p
    }

    fn logits() -> Vec<f32> {
        // probs ∝ exp: token 3 highest, then 1, 4, 0, 2.
        vec![0.0, 2.0, -1.0, 3.0, 1.0]
    }

    fn kept(p: &SamplingParams) -> Vec<u32> {
        let l = logits();
        let (_, m) = argmax(&l);
        let mut s = Sampler::new();
        let mut v: Vec<u32> = s.filtered_probs(&l, p, m).iter().map(|c| c.0).collect();
        v.sort();
        v
    }

    #[test]
    fn greedy_picks_argmax() {
        let mut s = Sampler::new();
        let out = s.sample(&logits(), &SamplingParams::greedy(4), 1, 0);
        assert_eq!(out.token, 3);
        assert!(out.logprob < 0.0 && out.logprob > -1.0);
    }

    #[test]
    fn top_k_keeps_k_best() {
        assert_eq!(kept(&params(|p| p.top_k = 2)), vec![1, 3]);
        assert_eq!(kept(&params(|p| p.top_k = 0)), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_p() {
        // softmax of [0,2,-1,3,1]: token 3 ≈ 0.636, token 1 ≈ 0.234, token 4 ≈ 0.086.
        assert_eq!(kept(&params(|p| p.top_p = 0.5)), vec![3]);
        assert_eq!(kept(&params(|p| p.top_p = 0.8)), vec![1, 3]);
        assert_eq!(kept(&params(|p| p.top_p = 0.9)), vec![1, 3, 4]);
    }

    #[test]
    fn min_p_cuts_relative_to_top() {
        // p(1)/p(3) = e^-1 ≈ 0.37, p(4)/p(3) = e^-2 ≈ 0.135.
        assert_eq!(kept(&params(|p| p.min_p = 0.3)), vec![1, 3]);
        assert_eq!(kept(&params(|p| p.min_p = 0.1)), vec![1, 3, 4]);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_seed_dependent() {
        let l: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let p = params(|_| {});
        let mut s = Sampler::new();
        let run = |s: &mut Sampler, seed| {
            (0..32)
                .map(|i| s.sample(&l, &p, seed, i).token)
                .collect::<Vec<_>>()
        };
        let a = run(&mut s, 7);
        let b = run(&mut s, 7);
        let c = run(&mut s, 8);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let l = logits();
        let p = params(|_| {});
        let mut s = Sampler::new();
        let n = 20_000;
        let hits = (0..n)
            .filter(|&i| s.sample(&l, &p, 99, i).token == 3)
            .count();
        let frac = hits as f64 / n as f64;
        assert!((frac - 0.636).abs() < 0.02, "frac {frac}");
    }
}
