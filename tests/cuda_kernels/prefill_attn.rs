//! `prefill_attn`: the flash prefill kernel (causal, cached prefixes) on a random paged cache,
//! over the head sizes and GQA groups of the model families, under a sliding window, and split
//! over the keys (chunks at the end of long contexts, the in-kernel merge); and over an e4m3
//! cache (tiles staged as e4m3 and widened in shared memory). On Hopper every case runs both the
//! wgmma kernel (the default there at head dims 64 and 128) and the mma.sync kernel.

use half::bf16;

use brook::executor::cuda::compile::prefill_wgmma_supported;
use brook::executor::cuda::kernels::prefill_attn_kernel;

use crate::harness::{attention_gpu_kv, poisoned, read_bf16, rng};
use crate::paged::{PrefillBatch, PrefillRun};

/// `seqs`: (query tokens, context); `window`: 0 or a sliding window (blocks before it freed).
/// Every (sequence, query, head) row against the reference.
fn check_prefill(seed: u64, shape: (usize, usize, usize), seqs: &[(usize, usize)], window: usize) {
    check_prefill_split(seed, shape, seqs, window, 1);
}

/// As `check_prefill`, with `splits` CTAs per (tile, head) over the keys, launched twice into a
/// re-poisoned output (the last CTA of each group must leave its arrival counter at zero).
fn check_prefill_split(
    seed: u64,
    shape: (usize, usize, usize),
    seqs: &[(usize, usize)],
    window: usize,
    splits: usize,
) {
    check_prefill_kv(seed, shape, seqs, window, splits, false);
}

/// `check_prefill_split` over an e4m3 cache when `fp8` (the reference reads the same quantized
/// K and V).
fn check_prefill_kv(
    seed: u64,
    (head_dim, heads, kv_heads): (usize, usize, usize),
    seqs: &[(usize, usize)],
    window: usize,
    splits: usize,
    fp8: bool,
) {
    let Some(mut g) = attention_gpu_kv(head_dim, heads / kv_heads, fp8) else {
        return;
    };
    let shape = (head_dim, heads, kv_heads);
    let mut b = PrefillBatch::random_kv(&mut rng(seed), shape, seqs, fp8);
    let freed = if window > 0 { b.with_window(window) } else { 0 };
    let n = b.tokens() * b.row_elems();
    let all: Vec<usize> = (0..seqs.len()).collect();
    let reference = b.reference();
    // Every kernel built for this GPU and shape: on Hopper the wgmma kernel's TMA and cp.async
    // builds, each with its pipelined (2-stage) loop (bf16 caches) and the 1-stage one, and the
    // mma.sync kernel other GPUs run.
    let built = prefill_wgmma_supported(g.compute_capability, head_dim);
    for (wgmma, stages, tma) in [
        (true, 2, true),
        (true, 2, false),
        (true, 1, true),
        (true, 1, false),
        (false, 1, false),
    ] {
        g.prefill_wgmma = wgmma;
        g.prefill_wg_stages = stages;
        g.prefill_tma = tma;
        g.load_attention(head_dim, heads / kv_heads).unwrap();
        let kernel = prefill_attn_kernel(&g, head_dim).unwrap();
        assert_eq!(kernel.contains("_wg_"), wgmma && built, "{kernel}");
        assert_eq!(
            kernel.ends_with("_st2"),
            wgmma && built && stages == 2 && !fp8,
            "{kernel}"
        );
        let out = poisoned::<bf16>(&g, n);
        match splits {
            1 => PrefillRun::new(&g, &b).flash(&all, &out),
            _ => PrefillRun::new(&g, &b).flash_split(&all, &out, splits, 2),
        }
        let label = |s: usize| {
            let (qlen, c) = seqs[s];
            format!(
                "prefill {kernel} (tma {tma}) hd{head_dim} g{} fp8 {fp8} window {window} ({freed} blocks freed) {splits} splits seq {s} (q {qlen}, ctx {c})",
                b.group()
            )
        };
        b.assert_rows(&read_bf16(&g, &out, n), &reference, 1.5e-2, label);
        if !kernel.contains("_wg_") {
            break; // the mma.sync kernel is checked (where no wgmma build exists, the first pass)
        }
    }
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

/// A fresh prompt of more (tile, head) CTAs than an H200 runs at once (640 at 3 an SM on 132
/// SMs): CTAs of later waves start on shared memory that earlier ones filled, so a tile read
/// before its copies land shows up here (it did for the TMA build's Q, before its cp.async
/// group was committed).
#[test]
fn prefill_attention_fresh_prompt_over_many_waves() {
    check_prefill(33, (64, 64, 64), &[(640, 640)], 0);
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

/// Split over the keys: chunks whose queries sit at the end of long contexts (1 to 130 queries
/// at 2-8k keys), a fresh prompt (its early tiles see fewer key tiles than there are splits:
/// empty splits), split counts that divide the key tiles and ones that do not.
#[test]
fn prefill_attention_split_kv_at_long_context() {
    let seqs = [(64, 4096), (17, 8000), (130, 3000), (2, 2500), (150, 150)];
    for (i, splits) in [2, 3, 8, 32].into_iter().enumerate() {
        check_prefill_split(70 + i as u64, (128, 4, 4), &seqs, 0, splits);
    }
}

/// Split over the keys for every head dim, under GQA (group 4) and a sliding window (the blocks
/// before each chunk's window freed: a split's rows may see none of its keys).
#[test]
fn prefill_attention_split_kv_gqa_window_every_head_dim() {
    let seqs = [(40, 2000), (100, 1100), (1, 700)];
    for (i, head_dim) in [64, 80, 96, 128, 256].into_iter().enumerate() {
        check_prefill_split(80 + i as u64, (head_dim, 8, 2), &seqs, 0, 5);
        check_prefill_split(90 + i as u64, (head_dim, 8, 2), &seqs, 300, 4);
    }
}

/// An e4m3 cache: fresh prompts, cached prefixes (the chunk's queries read prefix keys through
/// the block table) and a chunk ending a long prefix, for every head size (16: the tiny test
/// checkpoints, where a tile is 64 chunks for 128 threads) and groups 1, 4, 7.
#[test]
fn prefill_attention_fp8_cached_prefix_every_head_dim() {
    let seqs = [(70, 70), (5, 200), (130, 300), (64, 64), (2, 2), (17, 1000)];
    for (i, head_dim) in [16, 64, 80, 96, 128, 256].into_iter().enumerate() {
        for (j, group) in [1, 4, 7].into_iter().enumerate() {
            let seed = 700 + (3 * i + j) as u64;
            check_prefill_kv(seed, (head_dim, 2 * group, 2), &seqs, 0, 1, true);
        }
    }
}

/// An e4m3 cache split over the keys (the in-kernel merge, twice on the same counters) and
/// under a sliding window (blocks before it freed).
#[test]
fn prefill_attention_fp8_split_kv_and_window() {
    let seqs = [(64, 4096), (17, 8000), (130, 3000), (2, 2500), (150, 150)];
    for (i, splits) in [2, 8, 32].into_iter().enumerate() {
        check_prefill_kv(720 + i as u64, (128, 8, 2), &seqs, 0, splits, true);
    }
    let seqs = [(150, 150), (40, 300), (1, 70), (64, 1000), (97, 97)];
    check_prefill_kv(730, (128, 8, 2), &seqs, 50, 1, true);
    check_prefill_kv(731, (96, 4, 4), &seqs, 64, 4, true);
}
