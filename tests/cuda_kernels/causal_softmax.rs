//! `causal_softmax`: S rows of the GEMM prefill path turned into bf16 P (masked keys zero), out
//! of place and in place.

use brook::executor::cuda::kernels::{self, scores_ld, CausalSoftmaxParams};
use half::bf16;

use crate::harness::{assert_close, dev, poisoned, rand_f32, read, setup};

#[test]
fn causal_softmax_matches_reference_out_of_and_in_place() {
    let Some((g, mut r)) = setup(90) else { return };
    let heads = 3;
    // (query tokens, context): fresh, cached prefix, one key, odd sizes, several 32-key chunks.
    let seqs = [
        (7usize, 7usize),
        (5, 200),
        (1, 1),
        (33, 33),
        (40, 97),
        (2, 130),
    ];
    let mut s0 = Vec::new();
    let mut total = 0;
    for &(q, c) in &seqs {
        s0.push(total as i32);
        total += heads * q * scores_ld(c);
    }
    // Peaked scores so the softmax is far from uniform.
    let scores = rand_f32(&mut r, total, 12.0);
    let scale = 0.37f32;
    let entries: Vec<i32> = (0..seqs.len() as i32).rev().collect(); // entries out of seq order
    let s0_e: Vec<i32> = entries.iter().map(|&s| s0[s as usize]).collect();
    let q_len: Vec<i32> = seqs.iter().map(|s| s.0 as i32).collect();
    let ctx: Vec<i32> = seqs.iter().map(|s| s.1 as i32).collect();
    let bufs = [
        dev(&g, &scores),
        dev(&g, &entries),
        dev(&g, &s0_e),
        dev(&g, &q_len),
        dev(&g, &ctx),
    ];
    let probs = poisoned::<f32>(&g, total); // same bytes as the scores
    let p = CausalSoftmaxParams {
        scores: bufs[0].ptr(),
        probs: probs.ptr(),
        gemm_seq: bufs[1].ptr(),
        gemm_s0: bufs[2].ptr(),
        q_len: bufs[3].ptr(),
        context_lens: bufs[4].ptr(),
        num_gemm: entries.len() as i32,
        num_heads: heads as i32,
        scale,
    };
    let max_q = seqs.iter().map(|s| s.0).max().unwrap();
    unsafe { kernels::causal_softmax(&g, &p, max_q).unwrap() };
    let out: Vec<u16> = read(&g, &probs, 2 * total);
    // In place over a copy of the scores: the same bits.
    let inplace = dev(&g, &scores);
    let p2 = CausalSoftmaxParams {
        scores: inplace.ptr(),
        probs: inplace.ptr(),
        ..p
    };
    unsafe { kernels::causal_softmax(&g, &p2, max_q).unwrap() };
    let out2: Vec<u16> = read(&g, &inplace, 2 * total);
    for (s, &(q, c)) in seqs.iter().enumerate() {
        let ld = scores_ld(c);
        for h in 0..heads {
            for i in 0..q {
                let row = s0[s] as usize + (h * q + i) * ld;
                let visible = c - q + i + 1;
                let x: Vec<f64> = scores[row..row + visible]
                    .iter()
                    .map(|v| *v as f64 * scale as f64)
                    .collect();
                let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
                let mut want: Vec<f32> = x.iter().map(|v| ((v - m).exp() / z) as f32).collect();
                want.resize(c, 0.0);
                let bits = &out[2 * row..2 * row + c];
                let got: Vec<f32> = bits.iter().map(|b| bf16::from_bits(*b).to_f32()).collect();
                let what = format!("softmax seq {s} (q {q}, ctx {c}) head {h} row {i}");
                assert_close(&what, &got, &want, 8e-3);
                assert!(
                    got[visible..].iter().all(|&v| v == 0.0),
                    "{what}: masked keys not zero"
                );
                assert_eq!(
                    bits,
                    &out2[2 * row..2 * row + c],
                    "{what}: in place differs"
                );
            }
        }
    }
}
