use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

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
    let out = s.sample(&logits(), &SamplingParams::greedy(4), 1, 0, None);
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
            .map(|i| s.sample(&l, &p, seed, i, None).token)
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
        .filter(|&i| s.sample(&l, &p, 99, i, None).token == 3)
        .count();
    let frac = hits as f64 / n as f64;
    assert!((frac - 0.636).abs() < 0.02, "frac {frac}");
}

/// The processed logits by their definition, from the whole history (no incremental state):
/// bias added, blocked ids at -inf before `min_tokens`, then for every id seen in prompt or
/// output the repetition penalty (positive logits divided, others multiplied), and for ids in
/// the output `frequency × count + presence` subtracted. In f64.
fn reference(
    logits: &[f32],
    p: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
    output_index: usize,
) -> Vec<f64> {
    (0..logits.len() as u32)
        .map(|t| {
            let mut l = logits[t as usize] as f64;
            for &(id, b) in &p.logit_bias {
                if id == t {
                    l += b as f64;
                }
            }
            if output_index < p.min_tokens && p.min_tokens_blocked.contains(&t) {
                l = f64::NEG_INFINITY;
            }
            let n = output.iter().filter(|&&o| o == t).count() as f64;
            if n > 0.0 || prompt.contains(&t) {
                let rp = p.repetition_penalty as f64;
                l = if l > 0.0 { l / rp } else { l * rp };
            }
            l -= p.frequency_penalty as f64 * n;
            if n > 0.0 {
                l -= p.presence_penalty as f64;
            }
            l
        })
        .collect()
}

fn processed(
    logits: &[f32],
    p: &SamplingParams,
    counts: &TokenCounts,
    output_index: usize,
) -> Vec<f32> {
    let mut out = Vec::new();
    process_logits(logits, p, output_index, Some(counts), &mut out);
    out
}

#[test]
fn penalties_and_bias_on_known_values() {
    // Token 0 in the prompt only, token 1 twice in the output, token 2 unseen, token 3 biased.
    let l = vec![2.0, -1.0, 0.5, 1.0];
    let counts = TokenCounts::new(&[0], &[1, 1]);
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.frequency_penalty = 0.25;
        p.presence_penalty = 0.5;
        p.logit_bias = vec![(3, -3.0)];
    });
    // 0: 2 / 2 = 1. 1: -1 × 2 - (0.25 × 2 + 0.5) = -3. 2: unchanged. 3: 1 - 3 = -2.
    assert_eq!(processed(&l, &p, &counts, 0), vec![1.0, -3.0, 0.5, -2.0]);
    // The repetition penalty alone leaves output-only counts out of the subtraction.
    let rep = params(|p| p.repetition_penalty = 0.5);
    assert_eq!(processed(&l, &rep, &counts, 0), vec![4.0, -0.5, 0.5, 1.0]);
}

/// A sampled range narrower than the model's vocabulary (`serve --synthetic` with a smaller
/// tokenizer): bias, mask and penalty ids past it are skipped, the rest still apply.
#[test]
fn edits_past_the_sampled_range_are_skipped() {
    let l = vec![2.0, -1.0, 0.5];
    let counts = TokenCounts::new(&[0, 7], &[1, 9]);
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.frequency_penalty = 1.0;
        p.logit_bias = vec![(2, 1.0), (5, 100.0)];
        p.min_tokens = 1;
        p.min_tokens_blocked = vec![6];
    });
    // 0: 2 / 2. 1: -1 x 2 - 1. 2: 0.5 + 1.
    assert_eq!(processed(&l, &p, &counts, 0), vec![1.0, -3.0, 1.5]);
}

#[test]
fn penalties_and_bias_match_the_reference_on_random_histories() {
    let mut r = ChaCha8Rng::seed_from_u64(5);
    let vocab = 40;
    for case in 0..300 {
        let logits: Vec<f32> = (0..vocab).map(|_| r.random_range(-6.0..6.0)).collect();
        let prompt: Vec<u32> = (0..r.random_range(0..30))
            .map(|_| r.random_range(0..vocab as u32))
            .collect();
        let output: Vec<u32> = (0..r.random_range(0..40))
            .map(|_| r.random_range(0..vocab as u32 / 2))
            .collect();
        let mut bias: Vec<(u32, f32)> = (0..r.random_range(0..6))
            .map(|_| {
                (
                    r.random_range(0..vocab as u32),
                    r.random_range(-100.0..100.0),
                )
            })
            .collect();
        bias.sort_by_key(|b| b.0);
        bias.dedup_by_key(|b| b.0);
        let p = params(|p| {
            p.presence_penalty = r.random_range(-2.0..2.0);
            p.frequency_penalty = r.random_range(-2.0..2.0);
            p.repetition_penalty = [1.0, 0.7, 1.3, 2.0][case % 4];
            p.logit_bias = bias;
            p.min_tokens = r.random_range(0..4);
            p.min_tokens_blocked = vec![1, 7];
        });
        // Counts kept as an owner keeps them: prompt at creation, then one token at a time,
        // with tokens taken back now and then.
        let mut counts = TokenCounts::new(&prompt, &[]);
        for &t in &output {
            if r.random_bool(0.2) {
                let extra = r.random_range(0..vocab as u32);
                counts.push_output(extra);
                counts.pop_output(extra);
            }
            counts.push_output(t);
        }
        assert_eq!(counts, TokenCounts::new(&prompt, &output), "case {case}");
        let index = output.len() % 5;
        let got = processed(&logits, &p, &counts, index);
        let want = reference(&logits, &p, &prompt, &output, index);
        for (t, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let ok = (g == f32::NEG_INFINITY && w == f64::NEG_INFINITY)
                || (g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0);
            assert!(ok, "case {case} token {t}: got {g}, want {w} ({p:?})");
        }
    }
}

#[test]
fn bias_and_min_tokens_steer_the_draw_and_logprobs_stay_the_models() {
    let l = logits();
    let mut s = Sampler::new();
    // +100 on the least likely token makes it certain; its logprob is still the model's.
    let p = params(|p| p.logit_bias = vec![(2, 100.0)]);
    let (_, m) = argmax(&l);
    let lz = m + l.iter().map(|x| (x - m).exp()).sum::<f32>().ln();
    for i in 0..50 {
        let out = s.sample(&l, &p, 3, i, None);
        assert_eq!(out.token, 2);
        assert!((out.logprob - (l[2] - lz)).abs() < 1e-6);
    }
    // Greedy with -100 on the argmax takes the runner-up.
    let p = params(|p| {
        p.temperature = 0.0;
        p.logit_bias = vec![(3, -100.0)];
    });
    assert_eq!(s.sample(&l, &p, 1, 0, None).token, 1);
    // min_tokens masks the blocked ids (here the argmax, as an eos would be) before it.
    let p = params(|p| {
        p.temperature = 0.0;
        p.min_tokens = 2;
        p.min_tokens_blocked = vec![3];
    });
    assert_eq!(s.sample(&l, &p, 1, 0, None).token, 1);
    assert_eq!(s.sample(&l, &p, 1, 1, None).token, 1);
    assert_eq!(s.sample(&l, &p, 1, 2, None).token, 3);
}

#[test]
fn sampling_with_penalties_follows_the_processed_distribution() {
    let l = vec![1.0, 0.5, 0.0, 1.5, -0.5, 0.2];
    let counts = TokenCounts::new(&[0, 2], &[3, 3, 3, 1]);
    let p = params(|p| {
        p.frequency_penalty = 0.4;
        p.presence_penalty = 0.2;
        p.repetition_penalty = 1.5;
        p.logit_bias = vec![(4, 1.0)];
    });
    let want = reference(&l, &p, &[0, 2], &[3, 3, 3, 1], 0);
    let z: f64 = want.iter().map(|x| x.exp()).sum();
    let mut s = Sampler::new();
    let n = 30_000;
    let mut hits = [0usize; 6];
    for i in 0..n {
        hits[s.sample(&l, &p, 17, i, Some(&counts)).token as usize] += 1;
    }
    for t in 0..6 {
        let frac = hits[t] as f64 / n as f64;
        let prob = want[t].exp() / z;
        assert!((frac - prob).abs() < 0.015, "token {t}: {frac} vs {prob}");
    }
}

#[test]
fn top_logprobs_are_the_k_most_likely_in_order() {
    let l = vec![0.5, 2.0, 2.0, -1.0, 3.0, 0.0];
    let mut s = Sampler::new();
    let top = s.top_logprobs(&l, 3);
    let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
    // Equal logits (1 and 2) in id order.
    assert_eq!(ids, vec![4, 1, 2]);
    let m = 3.0f32;
    let lz = m + l.iter().map(|x| (x - m).exp()).sum::<f32>().ln();
    for &(t, lp) in &top {
        assert!((lp - (l[t as usize] - lz)).abs() < 1e-6);
    }
    assert_eq!(s.top_logprobs(&l, 0), vec![]);
    assert_eq!(s.top_logprobs(&l, 10).len(), 6);
}

#[test]
fn sample_seeds_keep_choice_zero_and_differ_per_index() {
    assert_eq!(sample_seed(42, 0), 42);
    let seeds: std::collections::HashSet<u64> = (0..64).map(|i| sample_seed(42, i)).collect();
    assert_eq!(seeds.len(), 64);
    assert_ne!(sample_seed(42, 1), sample_seed(43, 1));
}
