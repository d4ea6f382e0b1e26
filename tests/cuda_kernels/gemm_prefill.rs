//! The GEMM prefill path (src/executor/cuda/prefill_gemm.rs: gather, S GEMMs, causal softmax,
//! P·V GEMMs) alone and mixed with the flash kernel in one batch.

use half::bf16;

use crate::harness::{assert_close, attention_gpu_kv, poisoned, read_bf16, rng};
use crate::paged::{PrefillBatch, PrefillRun};

/// `seqs`: (query tokens, context); `on_flash`: the sequences the flash kernel takes, the GEMM
/// path takes the others. Checks, per head and query, (1) a mixed batch (both paths, one output)
/// against the CPU reference; (2) the GEMM path alone writes its rows only, and they agree with
/// the flash kernel on the same inputs.
fn check_gemm_prefill(
    seed: u64,
    shape: (usize, usize, usize),
    seqs: &[(usize, usize)],
    on_flash: &[usize],
) {
    check_gemm_prefill_kv(seed, shape, seqs, on_flash, false);
}

/// `check_gemm_prefill` over an e4m3 cache when `fp8` (kv_gather widens it to bf16).
fn check_gemm_prefill_kv(
    seed: u64,
    (head_dim, heads, kv_heads): (usize, usize, usize),
    seqs: &[(usize, usize)],
    on_flash: &[usize],
    fp8: bool,
) {
    let Some(g) = attention_gpu_kv(head_dim, heads / kv_heads, fp8) else {
        return;
    };
    let shape = (head_dim, heads, kv_heads);
    let b = PrefillBatch::random_kv(&mut rng(seed), shape, seqs, fp8);
    let run = PrefillRun::new(&g, &b);
    let on_gemm: Vec<usize> = (0..seqs.len()).filter(|s| !on_flash.contains(s)).collect();
    let n = b.tokens() * b.row_elems();
    let group = b.group();

    let mixed = poisoned::<bf16>(&g, n);
    run.gemm(&on_gemm, &mixed);
    if !on_flash.is_empty() {
        run.flash(on_flash, &mixed);
    }
    let label = |s: usize| {
        let (qlen, c) = seqs[s];
        let path = if on_flash.contains(&s) {
            "flash"
        } else {
            "gemm"
        };
        format!("mixed batch hd{head_dim} g{group} fp8 {fp8} seq {s} ({path}, q {qlen}, ctx {c})")
    };
    b.assert_rows(&read_bf16(&g, &mixed, n), &b.reference(), 1.5e-2, label);

    let gemm_only = poisoned::<bf16>(&g, n);
    run.gemm(&on_gemm, &gemm_only);
    let flash_all = poisoned::<bf16>(&g, n);
    run.flash(&(0..seqs.len()).collect::<Vec<_>>(), &flash_all);
    let (gg, ff) = (read_bf16(&g, &gemm_only, n), read_bf16(&g, &flash_all, n));
    assert!(
        b.rows_of(&gg, on_flash).iter().all(|x| x.is_nan()),
        "the GEMM path wrote rows of flash-path sequences"
    );
    for &s in &on_gemm {
        assert_close(
            &format!(
                "gemm path vs flash kernel, hd{head_dim} g{group} seq {s} {:?}",
                seqs[s]
            ),
            &b.rows_of(&gg, &[s]),
            &b.rows_of(&ff, &[s]),
            1e-2,
        );
    }
}

#[test]
fn gemm_prefill_mixed_with_flash_mha_hd128() {
    // Fresh prompts, cached prefixes (ctx > q), odd sizes, one over 2 softmax chunks of 32.
    let seqs = [(70, 70), (5, 200), (130, 300), (64, 64), (2, 2), (33, 95)];
    check_gemm_prefill(70, (128, 4, 4), &seqs, &[2, 3]);
}

#[test]
fn gemm_prefill_gqa_groups_4_8_and_3() {
    let seqs = [(100, 100), (33, 190), (17, 17), (129, 129)];
    check_gemm_prefill(71, (128, 8, 2), &seqs, &[2]);
    check_gemm_prefill(72, (64, 8, 1), &[(65, 65), (17, 1000), (3, 41)], &[1]);
    check_gemm_prefill(73, (64, 6, 2), &[(37, 37), (50, 80), (9, 120)], &[1]);
}

#[test]
fn gemm_prefill_alone() {
    // Every sequence on the GEMM path (no flash launch in the mixed run).
    check_gemm_prefill(74, (128, 4, 2), &[(3, 3), (250, 256), (7, 19)], &[]);
}

#[test]
fn gemm_prefill_fp8_cache_mixed_with_flash() {
    let seqs = [(70, 70), (5, 200), (130, 300), (64, 64), (2, 2), (33, 95)];
    check_gemm_prefill_kv(75, (128, 4, 4), &seqs, &[2, 3], true);
    check_gemm_prefill_kv(76, (64, 8, 2), &[(65, 65), (17, 1000), (3, 41)], &[1], true);
}
