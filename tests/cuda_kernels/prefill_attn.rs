//! `prefill_attn`: the flash prefill kernel (causal, cached prefixes) on a random paged cache,
//! over the head sizes and GQA groups of the model families, and under a sliding window.

use half::bf16;

use crate::harness::{attention_gpu, poisoned, read_bf16, rng};
use crate::paged::{PrefillBatch, PrefillRun};

/// `seqs`: (query tokens, context); `window`: 0 or a sliding window (blocks before it freed).
/// Every (sequence, query, head) row against the reference.
fn check_prefill(
    seed: u64,
    (head_dim, heads, kv_heads): (usize, usize, usize),
    seqs: &[(usize, usize)],
    window: usize,
) {
    let Some(g) = attention_gpu(head_dim, heads / kv_heads) else {
        return;
    };
    let mut b = PrefillBatch::random(&mut rng(seed), head_dim, heads, kv_heads, seqs);
    let freed = if window > 0 { b.with_window(window) } else { 0 };
    let n = b.tokens() * b.row_elems();
    let out = poisoned::<bf16>(&g, n);
    PrefillRun::new(&g, &b).flash(&(0..seqs.len()).collect::<Vec<_>>(), &out);
    let label = |s: usize| {
        let (qlen, c) = seqs[s];
        format!(
            "prefill hd{head_dim} g{} window {window} ({freed} blocks freed) seq {s} (q {qlen}, ctx {c})",
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
        (128, 4, 4),
        &[(70, 70), (5, 200), (130, 300), (64, 64), (2, 2)],
        0,
    );
}

#[test]
fn prefill_attention_gqa_hd128_and_hd64() {
    check_prefill(31, (128, 8, 2), &[(100, 100), (33, 190)], 0);
    check_prefill(32, (64, 8, 1), &[(65, 65), (17, 1000)], 0);
}

/// Head sizes 80, 96 and 256 (32-key tiles) and the groups of Qwen2.5 (5, 7) and 16, on odd
/// lengths.
#[test]
fn prefill_attention_every_head_dim_and_odd_groups() {
    let seqs = [(77, 77), (3, 131), (129, 200)];
    for (i, head_dim) in [64, 80, 96, 128, 256].into_iter().enumerate() {
        for (j, group) in [1, 5, 7, 16].into_iter().enumerate() {
            check_prefill(40 + (4 * i + j) as u64, (head_dim, 2 * group, 2), &seqs, 0);
        }
    }
}

/// A sliding window: rows see their last `window` keys (a row's first tiles may be all masked),
/// across chunks that start before, at and after the window, with the blocks before each chunk's
/// first window freed.
#[test]
fn prefill_attention_sliding_window() {
    let seqs = [(150, 150), (40, 300), (1, 70), (64, 1000), (97, 97)];
    check_prefill(60, (128, 8, 2), &seqs, 50);
    check_prefill(61, (96, 4, 4), &seqs, 64);
    check_prefill(62, (256, 14, 2), &seqs, 17);
}
