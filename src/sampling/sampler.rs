//! Token sampling from one row of logits: logit bias, the min_tokens mask and penalties
//! (presence, frequency, repetition), then greedy or temperature with top-k, top-p and min-p,
//! seeded; and log-probabilities (the sampled token's, the top k).
//!
//! The random draw for output token `i` of a request comes from a ChaCha stream keyed by
//! (seed, i), so a seeded request gives the same tokens whatever shares its batch and after a
//! preemption recomputes it.
//!
//! Processing order, as vLLM's: logit bias and the min_tokens mask (eos and stop ids at -inf
//! while fewer than `min_tokens` tokens were generated), then the penalties, then temperature
//! and the cuts. Log-probabilities are the model's own (raw logits, temperature 1), as vLLM
//! reports them by default. kernels/sample.cu does the same on the GPU.

use std::collections::{HashMap, HashSet};

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

/// What the penalties need of a request's tokens, kept incrementally by its owner (one update
/// per token, never a rescan): occurrences in the output, and which ids the prompt holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenCounts {
    output: HashMap<u32, u32>,
    prompt: HashSet<u32>,
}

impl TokenCounts {
    pub fn new(prompt: &[u32], output: &[u32]) -> Self {
        let mut c = TokenCounts {
            output: HashMap::with_capacity(output.len().max(16)),
            prompt: prompt.iter().copied().collect(),
        };
        for &t in output {
            c.push_output(t);
        }
        c
    }

    pub fn push_output(&mut self, token: u32) {
        *self.output.entry(token).or_insert(0) += 1;
    }

    /// Takes back an output token its owner dropped (a step result the scheduler did not keep).
    pub fn pop_output(&mut self, token: u32) {
        if let Some(n) = self.output.get_mut(&token) {
            *n -= 1;
            if *n == 0 {
                self.output.remove(&token);
            }
        }
    }

    pub fn output_count(&self, token: u32) -> u32 {
        self.output.get(&token).copied().unwrap_or(0)
    }

    /// In the prompt or the output: what the repetition penalty covers.
    pub fn seen(&self, token: u32) -> bool {
        self.prompt.contains(&token) || self.output.contains_key(&token)
    }

    /// Applies the penalties to the ids seen, in place; O(distinct ids seen), not O(vocab).
    /// Ids past `logits` (a sampled range narrower than the model's vocabulary) are skipped.
    pub fn apply_penalties(&self, logits: &mut [f32], p: &SamplingParams) {
        for (&t, &n) in &self.output {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = penalize(*l, n, true, p);
            }
        }
        if p.repetition_penalty != 1.0 {
            for &t in self.prompt.iter().filter(|t| !self.output.contains_key(t)) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = penalize(*l, 0, true, p);
                }
            }
        }
    }
}

/// One logit after the penalties: `n` occurrences in the output, `seen` in prompt or output.
/// sample.cu's `penalize` computes the same, rounding step by step as here.
pub fn penalize(logit: f32, n: u32, seen: bool, p: &SamplingParams) -> f32 {
    let rp = p.repetition_penalty;
    let l = if seen && rp != 1.0 {
        if logit > 0.0 {
            logit / rp
        } else {
            logit * rp
        }
    } else {
        logit
    };
    let presence = if n > 0 { p.presence_penalty } else { 0.0 };
    l - (p.frequency_penalty * n as f32 + presence)
}

/// The logits the draw uses, before temperature and the cuts, into `out`: `logits` with the
/// logit bias added, the min_tokens mask applied (-inf) and then the penalties (over `counts`;
/// none without). Only needed when `params.processes_logits(output_index)`.
pub fn process_logits(
    logits: &[f32],
    params: &SamplingParams,
    output_index: usize,
    counts: Option<&TokenCounts>,
    out: &mut Vec<f32>,
) {
    out.clear();
    out.extend_from_slice(logits);
    // Ids past the sampled range (a tokenizer smaller than the model) cannot be drawn anyway.
    for &(t, b) in &params.logit_bias {
        if let Some(l) = out.get_mut(t as usize) {
            *l += b;
        }
    }
    if params.masks_stop_ids(output_index) {
        for &t in &params.min_tokens_blocked {
            if let Some(l) = out.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    if let Some(c) = counts.filter(|_| params.has_penalties()) {
        c.apply_penalties(out, params);
    }
}

/// Reusable scratch so sampling does not allocate per token.
#[derive(Debug, Default)]
pub struct Sampler {
    candidates: Vec<(u32, f32)>,
    work: Vec<f32>,
}

impl Sampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Samples one token. `logits` has the vocabulary's length; `counts` holds the request's
    /// tokens when it has penalties.
    pub fn sample(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        seed: u64,
        output_index: usize,
        counts: Option<&TokenCounts>,
    ) -> Sampled {
        let (_, max_logit) = argmax(logits);
        let log_z = log_sum_exp(logits, max_logit);
        let mut work = std::mem::take(&mut self.work);
        let row = if params.processes_logits(output_index) {
            process_logits(logits, params, output_index, counts, &mut work);
            // Everything masked cannot happen with valid params; sample the model's own then.
            if argmax(&work).1 == f32::NEG_INFINITY {
                logits
            } else {
                &work[..]
            }
        } else {
            logits
        };
        let token = self.pick(row, params, seed, output_index);
        self.work = work;
        Sampled {
            token,
            logprob: logits[token as usize] - log_z,
        }
    }

    /// Greedy, or a draw over the filtered candidates of `row`.
    fn pick(
        &mut self,
        row: &[f32],
        params: &SamplingParams,
        seed: u64,
        output_index: usize,
    ) -> u32 {
        let (argmax, max_logit) = argmax(row);
        if params.is_greedy() {
            return argmax;
        }
        let probs = self.filtered_probs(row, params, max_logit);
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
        token
    }

    /// The `k` most likely tokens of `logits` (temperature 1), as (id, log-probability), most
    /// likely first; equal logits in id order (as sample.cu).
    pub fn top_logprobs(&mut self, logits: &[f32], k: usize) -> Vec<(u32, f32)> {
        let k = k.min(logits.len());
        if k == 0 {
            return Vec::new();
        }
        let (_, max_logit) = argmax(logits);
        let log_z = log_sum_exp(logits, max_logit);
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if k < cands.len() {
            cands.select_nth_unstable_by(k - 1, desc);
            cands.truncate(k);
        }
        cands.sort_unstable_by(desc);
        cands.iter().map(|&(t, l)| (t, l - log_z)).collect()
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
mod tests;
