//! `prefill_attn`: the flash prefill kernel (causal, cached prefixes) on a random paged cache.

use half::bf16;

use crate::harness::{gpu, poisoned, read_bf16, rng};
use crate::paged::{PrefillBatch, PrefillRun};

/// `seqs`: (query tokens, context). Every (sequence, query, head) row against the reference.
fn check_prefill(
    seed: u64,
    head_dim: usize,
    heads: usize,
    kv_heads: usize,
    seqs: &[(usize, usize)],
) {
    let Some(g) = gpu() else { return };
    let b = PrefillBatch::random(&mut rng(seed), head_dim, heads, kv_heads, seqs);
    let n = b.tokens() * b.row_elems();
    let out = poisoned::<bf16>(&g, n);
    PrefillRun::new(&g, &b).flash(&(0..seqs.len()).collect::<Vec<_>>(), &out);
    let label = |s: usize| {
        let (qlen, c) = seqs[s];
        format!(
            "prefill hd{head_dim} g{} seq {s} (q {qlen}, ctx {c})",
            b.group()
        )
    };
    b.assert_rows(&read_bf16(&g, &out, n), &b.reference(), 1.5e-2, label);
}

#[test]
fn prefill_attention_causal_with_cached_prefix_hd128() {
    // (query tokens, context): fresh prompts, a cached prefix, a chunk that ends a long prefix.
    check_prefill(
        30,
        128,
        4,
        4,
        &[(70, 70), (5, 200), (130, 300), (64, 64), (2, 2)],
    );
}

#[test]
fn prefill_attention_gqa_hd128_and_hd64() {
    check_prefill(31, 128, 8, 2, &[(100, 100), (33, 190)]);
    check_prefill(32, 64, 8, 1, &[(65, 65), (17, 1000)]);
}
