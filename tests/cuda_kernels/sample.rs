//! `sample`: greedy and filtered sampling (temperature, top-k, top-p, min-p) against the CPU
//! sampler, with draws fixed by (seed, output index).

use brook::executor::cuda::device::Gpu;
use brook::executor::cuda::kernels::{self, SampleArgs, SampleEdit, SampleParams, SAMPLE_MAX_TOP};
use brook::sampling::params::SamplingParams;
use brook::sampling::sampler::{argmax, Sampler};
use rand::Rng;

use crate::harness::{assert_max_abs, dev, poisoned, rand_f32, read, setup};

pub fn sample_args(p: &SamplingParams, seed: u64, index: u64) -> SampleArgs {
    SampleArgs {
        seed,
        output_index: index,
        temperature: p.temperature,
        top_p: p.top_p,
        min_p: p.min_p,
        top_k: p.top_k as i32,
        presence: p.presence_penalty,
        frequency: p.frequency_penalty,
        repetition: p.repetition_penalty,
        num_logprobs: p.logprobs.unwrap_or(0) as i32,
        ..SampleArgs::default()
    }
}

/// What one run of the kernel wrote: tokens, logprobs, the processed rows (`work`), the top
/// log-probabilities (ids and values, `SAMPLE_MAX_TOP` per row) and the token counts after.
pub struct SampleOut {
    pub tokens: Vec<i32>,
    pub logprobs: Vec<f32>,
    pub work: Vec<f32>,
    pub top_ids: Vec<i32>,
    pub top_logprobs: Vec<f32>,
    pub counts: Vec<u32>,
}

/// Runs the sampler kernel on `rows` of logits with `edits` and token `counts` (rows of
/// `vocab`); every output buffer is poisoned before.
pub fn run_sample_full(
    g: &Gpu,
    logits: &[f32],
    vocab: usize,
    args: &[SampleArgs],
    edits: &[SampleEdit],
    counts: &[u32],
) -> SampleOut {
    run_sample_impl(g, logits, vocab, vocab, args, edits, counts)
}

/// The sampler over rows of `stride` logits, of which the first `vocab` are sampled; returns
/// (tokens, logprobs).
fn run_sample_strided(
    g: &Gpu,
    logits: &[f32],
    vocab: usize,
    stride: usize,
    args: &[SampleArgs],
) -> (Vec<i32>, Vec<f32>) {
    let out = run_sample_impl(g, logits, vocab, stride, args, &[], &[]);
    (out.tokens, out.logprobs)
}

fn run_sample_impl(
    g: &Gpu,
    logits: &[f32],
    vocab: usize,
    stride: usize,
    args: &[SampleArgs],
    edits: &[SampleEdit],
    counts: &[u32],
) -> SampleOut {
    let n = args.len();
    let (lb, ab) = (dev(g, logits), dev(g, args));
    let eb = dev(g, &[edits, &[SampleEdit::default()]].concat());
    let cb = dev(g, &[counts, &[0]].concat());
    let (tb, pb) = (poisoned::<i32>(g, n), poisoned::<f32>(g, n));
    let wb = poisoned::<f32>(g, n * stride);
    let (ib, vb) = (
        poisoned::<i32>(g, n * SAMPLE_MAX_TOP),
        poisoned::<f32>(g, n * SAMPLE_MAX_TOP),
    );
    let p = SampleParams {
        logits: lb.ptr(),
        args: ab.ptr(),
        tokens: tb.ptr(),
        logprobs: pb.ptr(),
        edits: eb.ptr(),
        counts: cb.ptr(),
        work: wb.ptr(),
        top_ids: ib.ptr(),
        top_logprobs: vb.ptr(),
        num_rows: n as i32,
        vocab: vocab as i32,
        stride: stride as i32,
    };
    unsafe { kernels::sample(g, &p).unwrap() };
    SampleOut {
        tokens: read(g, &tb, n),
        logprobs: read(g, &pb, n),
        work: read(g, &wb, n * stride),
        top_ids: read(g, &ib, n * SAMPLE_MAX_TOP),
        top_logprobs: read(g, &vb, n * SAMPLE_MAX_TOP),
        counts: read(g, &cb, counts.len()),
    }
}

/// Runs the sampler kernel on `rows` of logits; returns (tokens, logprobs).
fn run_sample(g: &Gpu, logits: &[f32], vocab: usize, args: &[SampleArgs]) -> (Vec<i32>, Vec<f32>) {
    let out = run_sample_full(g, logits, vocab, args, &[], &[]);
    (out.tokens, out.logprobs)
}

/// Sampling with (temperature, top_k, top_p, min_p), the rest default.
fn filtered((temperature, top_k, top_p, min_p): (f32, usize, f32, f32)) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..Default::default()
    }
}

pub fn log_softmax_at(logits: &[f32], t: usize) -> f32 {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|l| (*l as f64 - m).exp()).sum();
    (logits[t] as f64 - m - z.ln()) as f32
}

/// Checks each row's token (rows `stride` apart, of which the first `vocab` ids are sampled,
/// row i with `variants[i % len]`): below `vocab`, the argmax for a greedy row, else among the
/// CPU sampler's filtered candidates. Returns the reference log-probability of each token.
fn check_sampled_rows(
    logits: &[f32],
    stride: usize,
    vocab: usize,
    tokens: &[i32],
    variants: &[SamplingParams],
) -> Vec<f32> {
    let mut sampler = Sampler::new();
    let mut want_logprobs = Vec::with_capacity(tokens.len());
    for (i, &tok) in tokens.iter().enumerate() {
        let p = &variants[i % variants.len()];
        let row = &logits[i * stride..i * stride + vocab];
        let tok = tok as usize;
        assert!(tok < vocab, "row {i}: token {tok} is past the sampled ids");
        want_logprobs.push(log_softmax_at(row, tok));
        let (top, m) = argmax(row);
        if p.is_greedy() {
            assert_eq!(tok as u32, top, "row {i}: greedy");
        } else {
            let kept: Vec<u32> = sampler
                .filtered_probs(row, p, m)
                .iter()
                .map(|c| c.0)
                .collect();
            assert!(
                kept.contains(&(tok as u32)),
                "row {i} ({p:?}): token {tok} is not among the {} kept",
                kept.len()
            );
        }
    }
    want_logprobs
}

#[test]
fn sampling_greedy_and_filters_match_the_cpu_sampler() {
    let Some((g, mut r)) = setup(60) else { return };
    let vocab = 32003;
    // Greedy, then (temperature, top_k, top_p, min_p) with the cuts off at 0, 1.0 and 0.0.
    let filters = [
        (0.8, 0, 1.0, 0.0),
        (1.0, 5, 1.0, 0.0),
        (0.7, 0, 0.9, 0.0),
        (1.3, 0, 1.0, 0.2),
        (0.9, 40, 0.8, 0.05),
        (1.0, 1, 1.0, 0.0),
    ];
    let variants: Vec<SamplingParams> = std::iter::once(SamplingParams::greedy(1))
        .chain(filters.into_iter().map(filtered))
        .collect();
    let rows = variants.len() * 9;
    // Peaked logits so the filters bite: a few large values over noise.
    let mut logits = rand_f32(&mut r, rows * vocab, 3.0);
    for row in logits.chunks_mut(vocab) {
        for _ in 0..20 {
            row[r.random_range(0..vocab)] += r.random_range(4.0..9.0);
        }
    }
    let args: Vec<SampleArgs> = (0..rows)
        .map(|i| {
            sample_args(
                &variants[i % variants.len()],
                1000 + i as u64,
                (i * 7) as u64,
            )
        })
        .collect();
    let (tokens, logprobs) = run_sample(&g, &logits, vocab, &args);
    let want_logprobs = check_sampled_rows(&logits, vocab, vocab, &tokens, &variants);
    assert_max_abs(
        "logprob of each row's token",
        &logprobs,
        &want_logprobs,
        1e-3,
    );
    // Same (seed, index) gives the same token in another batch at another row.
    let perm: Vec<usize> = (0..rows).rev().collect();
    let logits2: Vec<f32> = perm
        .iter()
        .flat_map(|&i| logits[i * vocab..(i + 1) * vocab].to_vec())
        .collect();
    let args2: Vec<SampleArgs> = perm.iter().map(|&i| args[i]).collect();
    let (tokens2, _) = run_sample(&g, &logits2, vocab, &args2);
    for (j, &i) in perm.iter().enumerate() {
        assert_eq!(tokens2[j], tokens[i], "row {i} changed with batch order");
    }
}

#[test]
fn sampling_follows_the_filtered_distribution() {
    let Some((g, mut r)) = setup(61) else { return };
    let vocab = 50;
    let row = rand_f32(&mut r, vocab, 2.5);
    let p = filtered((0.8, 20, 0.9, 0.0));
    let n = 20000;
    let logits: Vec<f32> = (0..n).flat_map(|_| row.clone()).collect();
    let args: Vec<SampleArgs> = (0..n).map(|i| sample_args(&p, 5, i as u64)).collect();
    let (tokens, _) = run_sample(&g, &logits, vocab, &args);
    let mut sampler = Sampler::new();
    let (_, m) = argmax(&row);
    let kept = sampler.filtered_probs(&row, &p, m).to_vec();
    let total: f32 = kept.iter().map(|c| c.1).sum();
    let mut counts = vec![0usize; vocab];
    tokens.iter().for_each(|&t| counts[t as usize] += 1);
    for &(t, w) in &kept {
        let want = (w / total) as f64;
        let got = counts[t as usize] as f64 / n as f64;
        let sd = (want * (1.0 - want) / n as f64).sqrt();
        assert!(
            (got - want).abs() < 5.0 * sd + 1e-3,
            "token {t}: frequency {got:.4}, probability {want:.4}"
        );
    }
    let outside: usize = (0..vocab)
        .filter(|t| !kept.iter().any(|c| c.0 as usize == *t))
        .map(|t| counts[t])
        .sum();
    assert_eq!(outside, 0, "tokens outside the filtered set were drawn");
}

#[test]
fn sampling_reads_only_the_first_vocab_ids_of_wider_rows() {
    let Some((g, mut r)) = setup(62) else { return };
    // A 32000-wide row (Llama-2's LM head) sampled as a 4096-id tokenizer's vocabulary; the
    // masked tail holds the largest logits, so reading any of it changes the result.
    let (vocab, stride) = (4096, 32000);
    let variants = [
        SamplingParams::greedy(1),
        filtered((1.0, 0, 1.0, 0.0)),
        filtered((0.8, 40, 0.9, 0.05)),
    ];
    let rows = variants.len() * 4;
    let mut logits = rand_f32(&mut r, rows * stride, 3.0);
    for row in logits.chunks_mut(stride) {
        row[vocab..].iter_mut().for_each(|x| *x += 50.0);
    }
    let args: Vec<SampleArgs> = (0..rows)
        .map(|i| sample_args(&variants[i % variants.len()], 77 + i as u64, i as u64))
        .collect();
    let (tokens, logprobs) = run_sample_strided(&g, &logits, vocab, stride, &args);
    let want_logprobs = check_sampled_rows(&logits, stride, vocab, &tokens, &variants);
    assert_max_abs(
        "logprob over the sampled ids",
        &logprobs,
        &want_logprobs,
        1e-3,
    );
}
