//! `sample` with logit edits (bias, the min_tokens mask), penalties over device token counts and
//! top log-probabilities, against the CPU sampler (`process_logits`, `filtered_probs`,
//! `top_logprobs`); and the count upkeep kernels (`sample_counts_update`, `sample_counts_move`)
//! against a host model.

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::kernels::{
    self, CountUpdate, SampleArgs, SampleCountsMoveParams, SampleCountsUpdateParams, SampleEdit,
    COUNT_PROMPT, SAMPLE_MAX_TOP,
};
use brook::sampling::params::SamplingParams;
use brook::sampling::sampler::{argmax, process_logits, Sampler, TokenCounts};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::harness::{assert_max_abs, dev, rand_f32, read, setup};
use crate::sample::{log_softmax_at, run_sample_full, sample_args};

const PROMPT_BIT: u32 = 0x8000_0000;

/// One row's random history and params: penalties (or not), bias, a min_tokens mask, logprobs.
struct Case {
    params: SamplingParams,
    prompt: Vec<u32>,
    output: Vec<u32>,
    output_index: usize,
}

fn random_case(r: &mut ChaCha8Rng, vocab: usize, i: usize) -> Case {
    let tok = |r: &mut ChaCha8Rng| r.random_range(0..vocab as u32);
    let mut bias: Vec<(u32, f32)> = (0..r.random_range(0..40))
        .map(|_| (tok(r), r.random_range(-100.0..100.0)))
        .collect();
    bias.sort_by_key(|b| b.0);
    bias.dedup_by_key(|b| b.0);
    let mut blocked: Vec<u32> = (0..r.random_range(0..4)).map(|_| tok(r)).collect();
    blocked.sort_unstable();
    blocked.dedup();
    let penalties = i % 3 != 0;
    let params = SamplingParams {
        temperature: [0.0, 0.7, 1.0, 1.3][i % 4],
        top_k: [0, 0, 40, 0, 5][i % 5],
        top_p: [1.0, 0.9, 1.0][i % 3],
        min_p: [0.0, 0.0, 0.05][i % 3],
        presence_penalty: if penalties {
            r.random_range(-2.0..2.0)
        } else {
            0.0
        },
        frequency_penalty: if penalties {
            r.random_range(-2.0..2.0)
        } else {
            0.0
        },
        repetition_penalty: if penalties {
            [1.0, 1.3, 0.8][i % 3]
        } else {
            1.0
        },
        logit_bias: bias,
        min_tokens: r.random_range(0..3),
        min_tokens_blocked: blocked,
        logprobs: [None, Some(0), Some(5), Some(20)][i % 4],
        ..SamplingParams::default()
    };
    Case {
        params,
        // Most of the vocabulary unseen, as in real use; some ids in both.
        prompt: (0..r.random_range(0..200)).map(|_| tok(r)).collect(),
        output: (0..r.random_range(0..100))
            .map(|_| r.random_range(0..300))
            .collect(),
        output_index: r.random_range(0..4),
    }
}

/// The kernel's edits for a row: bias, and -inf for masked ids (one entry per id).
fn edits_of(c: &Case) -> Vec<SampleEdit> {
    let mut m: std::collections::BTreeMap<u32, f32> = c.params.logit_bias.iter().copied().collect();
    if c.params.masks_stop_ids(c.output_index) {
        for &t in &c.params.min_tokens_blocked {
            m.insert(t, f32::NEG_INFINITY);
        }
    }
    m.into_iter()
        .map(|(token, value)| SampleEdit {
            token: token as i32,
            value,
        })
        .collect()
}

/// The device form of a history: prompt bit and output count per id.
fn count_row(c: &Case, vocab: usize) -> Vec<u32> {
    let mut row = vec![0u32; vocab];
    for &t in &c.prompt {
        row[t as usize] |= PROMPT_BIT;
    }
    for &t in &c.output {
        row[t as usize] += 1;
    }
    row
}

#[test]
fn penalties_edits_and_top_logprobs_match_the_cpu_sampler() {
    let Some((g, mut r)) = setup(62) else { return };
    let vocab = 32003;
    let rows = 48;
    let mut logits = rand_f32(&mut r, rows * vocab, 3.0);
    for row in logits.chunks_mut(vocab) {
        for _ in 0..20 {
            row[r.random_range(0..300)] += r.random_range(4.0..9.0);
        }
    }
    let cases: Vec<Case> = (0..rows).map(|i| random_case(&mut r, vocab, i)).collect();
    // Rows with penalties own count rows in reverse order (a count row is not the batch row).
    let count_rows = rows;
    let mut counts = vec![0u32; count_rows * vocab];
    let mut args = Vec::new();
    let mut edits = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let mut a = sample_args(&c.params, 7000 + i as u64, c.output_index as u64);
        if c.params.has_penalties() {
            a.counts_row = (count_rows - 1 - i) as i32;
            let at = a.counts_row as usize * vocab;
            counts[at..at + vocab].copy_from_slice(&count_row(c, vocab));
        }
        let e = edits_of(c);
        a.edit_start = edits.len() as i32;
        a.num_edits = e.len() as i32;
        edits.extend(e);
        args.push(a);
    }
    let out = run_sample_full(&g, &logits, vocab, &args, &edits, &counts);
    let mut sampler = Sampler::new();
    let mut want_counts = counts.clone();
    let (mut want_lp, mut got_top, mut want_top) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in cases.iter().enumerate() {
        let raw = &logits[i * vocab..(i + 1) * vocab];
        let p = &c.params;
        let history = TokenCounts::new(&c.prompt, &c.output);
        let processes = p.processes_logits(c.output_index);
        let mut processed = Vec::new();
        process_logits(raw, p, c.output_index, Some(&history), &mut processed);
        if processes {
            let work = &out.work[i * vocab..(i + 1) * vocab];
            for t in 0..vocab {
                let (gw, cw) = (work[t], processed[t]);
                let same = gw == cw || (gw - cw).abs() <= 1e-5 * cw.abs().max(1.0);
                assert!(same, "row {i} token {t}: work {gw} vs cpu {cw} ({p:?})");
            }
        } else {
            processed = raw.to_vec();
        }
        let tok = out.tokens[i] as usize;
        assert!(tok < vocab, "row {i}: token {tok}");
        let (best, m) = argmax(&processed);
        if p.is_greedy() {
            assert_eq!(
                tok as u32, best,
                "row {i}: greedy over the processed logits"
            );
        } else {
            let kept: Vec<u32> = (sampler.filtered_probs(&processed, p, m).iter())
                .map(|c| c.0)
                .collect();
            assert!(
                kept.contains(&(tok as u32)),
                "row {i}: token {tok} not kept"
            );
        }
        if p.masks_stop_ids(c.output_index) {
            assert!(
                !p.min_tokens_blocked.contains(&(tok as u32)),
                "row {i}: masked {tok}"
            );
        }
        want_lp.push(log_softmax_at(raw, tok));
        if p.has_penalties() {
            want_counts[args[i].counts_row as usize * vocab + tok] += 1;
        }
        let k = p.logprobs.unwrap_or(0);
        let cpu = sampler.top_logprobs(raw, k);
        let ids = &out.top_ids[i * SAMPLE_MAX_TOP..i * SAMPLE_MAX_TOP + k];
        let cpu_ids: Vec<i32> = cpu.iter().map(|t| t.0 as i32).collect();
        assert_eq!(ids, &cpu_ids[..], "row {i}: top ids");
        got_top.extend_from_slice(&out.top_logprobs[i * SAMPLE_MAX_TOP..][..k]);
        want_top.extend(cpu.iter().map(|t| t.1));
    }
    assert_max_abs("logprob of each row's token", &out.logprobs, &want_lp, 1e-3);
    assert_max_abs("top log-probabilities", &got_top, &want_top, 1e-3);
    // Each row with penalties counted its token; nothing else changed.
    assert!(out.counts == want_counts, "token counts after sampling");
}

#[test]
fn sampling_with_penalties_follows_the_processed_distribution() {
    let Some((g, mut r)) = setup(63) else { return };
    let vocab = 50;
    let row = rand_f32(&mut r, vocab, 2.0);
    let case = Case {
        params: SamplingParams {
            temperature: 0.9,
            presence_penalty: 0.5,
            frequency_penalty: 0.3,
            repetition_penalty: 1.4,
            logit_bias: vec![(3, 2.0), (11, -1.0)],
            ..SamplingParams::default()
        },
        prompt: vec![1, 2, 3, 4, 9],
        output: vec![4, 4, 7, 20, 20, 20],
        output_index: 6,
    };
    let n: usize = 20000;
    let logits: Vec<f32> = (0..n).flat_map(|_| row.clone()).collect();
    // Each row its own counts row: the kernel counts what it samples.
    let counts: Vec<u32> = (0..n).flat_map(|_| count_row(&case, vocab)).collect();
    let edits = edits_of(&case);
    let args: Vec<SampleArgs> = (0..n)
        .map(|i| SampleArgs {
            counts_row: i as i32,
            num_edits: edits.len() as i32,
            ..sample_args(&case.params, 5, i as u64)
        })
        .collect();
    let out = run_sample_full(&g, &logits, vocab, &args, &edits, &counts);
    let mut processed = Vec::new();
    let history = TokenCounts::new(&case.prompt, &case.output);
    process_logits(&row, &case.params, 6, Some(&history), &mut processed);
    let m = argmax(&processed).1;
    let inv_t = 1.0 / case.params.temperature as f64;
    let w: Vec<f64> = processed
        .iter()
        .map(|&l| ((l - m) as f64 * inv_t).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut hits = vec![0usize; vocab];
    out.tokens.iter().for_each(|&t| hits[t as usize] += 1);
    for t in 0..vocab {
        let want = w[t] / total;
        let got = hits[t] as f64 / n as f64;
        let sd = (want * (1.0 - want) / n as f64).sqrt();
        assert!(
            (got - want).abs() < 5.0 * sd + 1e-3,
            "token {t}: frequency {got:.4}, probability {want:.4}"
        );
    }
}

fn update_counts(g: &Gpu, counts: &DevBuf, updates: &[CountUpdate]) {
    let ub = dev(g, updates);
    let p = SampleCountsUpdateParams {
        counts: counts.ptr(),
        updates: ub.ptr(),
        num_updates: updates.len() as i32,
    };
    unsafe { kernels::sample_counts_update(g, &p).unwrap() };
}

#[test]
fn count_updates_and_row_moves_match_a_host_model() {
    let Some((g, mut r)) = setup(64) else { return };
    let (rows, vocab) = (6, 1001);
    let mut host: Vec<u32> = (0..rows * vocab)
        .map(|_| match r.random_range(0..4) {
            0 => PROMPT_BIT | r.random_range(0..5),
            1 => r.random_range(1..5),
            _ => 0,
        })
        .collect();
    let buf = dev(&g, &host);
    // Many updates, indices repeated (the kernel's atomics), prompt marks, takes back — of
    // counts present before the launch only (the kernel's contract: updates apply in any order).
    let mut before = host.clone();
    let mut updates = Vec::new();
    for _ in 0..50_000 {
        let index = r.random_range(0..(rows * vocab) as u32);
        let delta = match r.random_range(0..5) {
            0 => COUNT_PROMPT,
            1 if before[index as usize] & !PROMPT_BIT > 0 => {
                before[index as usize] -= 1;
                -1
            }
            _ => r.random_range(1..3),
        };
        let c = &mut host[index as usize];
        if delta == COUNT_PROMPT {
            *c |= PROMPT_BIT;
        } else {
            *c = c.wrapping_add(delta as u32);
        }
        updates.push(CountUpdate { index, delta });
    }
    update_counts(&g, &buf, &updates);
    assert!(read::<u32>(&g, &buf, rows * vocab) == host, "after updates");
    // Row 5 moves into row 1's place, then row 4 into row 5's.
    for (from, to) in [(5usize, 1usize), (4, 5)] {
        let p = SampleCountsMoveParams {
            counts: buf.ptr(),
            from: from as i32,
            to: to as i32,
            vocab: vocab as i32,
        };
        unsafe { kernels::sample_counts_move(&g, &p).unwrap() };
        host.copy_within(from * vocab..(from + 1) * vocab, to * vocab);
    }
    assert!(read::<u32>(&g, &buf, rows * vocab) == host, "after moves");
}
