//! `embedding`: token rows gathered from the bf16 table into the fp32 residual stream, whole or
//! from a tensor-parallel rank's vocabulary slice (zero rows for tokens outside it).

use brook::executor::cuda::kernels::{self, EmbeddingParams};
use rand::Rng;

use crate::harness::{dev, poisoned, rand_bf16, read, setup, to_f32};

/// Gathers `t` random tokens of a `vocab`-word vocabulary through the rows
/// [start, start + rows) of it and checks every output row.
fn check(vocab: usize, start: usize, rows: usize) {
    let Some((g, mut r)) = setup(1) else { return };
    let (d, t) = (392, 37);
    let table = rand_bf16(&mut r, rows * d, 1.0);
    let mut tokens: Vec<u32> = (0..t).map(|_| r.random_range(0..vocab as u32)).collect();
    // Both edges of the slice and both sides of it, whatever the draw.
    tokens[..4].copy_from_slice(&[
        start as u32,
        (start + rows - 1) as u32,
        start.saturating_sub(1) as u32,
        ((start + rows) % vocab) as u32,
    ]);
    let (tb, tk, out) = (
        dev(&g, &table),
        dev(&g, &tokens),
        poisoned::<f32>(&g, t * d),
    );
    let p = EmbeddingParams {
        table: tb.ptr(),
        tokens: tk.ptr(),
        out: out.ptr(),
        num_tokens: t as i32,
        d: d as i32,
        vocab_start: start as u32,
        vocab_rows: rows as u32,
    };
    unsafe { kernels::embedding(&g, &p).unwrap() };
    let got: Vec<f32> = read(&g, &out, t * d);
    for (i, &tok) in tokens.iter().enumerate() {
        let tok = tok as usize;
        let want = match tok.checked_sub(start).filter(|&l| l < rows) {
            Some(l) => to_f32(&table[l * d..(l + 1) * d]),
            None => vec![0.0; d],
        };
        assert_eq!(&got[i * d..(i + 1) * d], &want[..], "row {i} (token {tok})");
    }
}

#[test]
fn embedding_gathers_rows() {
    check(1003, 0, 1003);
}

#[test]
fn embedding_of_a_vocabulary_slice_zeroes_other_tokens() {
    // The middle rank of three (rows 335..670) and the last one's padded slice.
    check(1003, 335, 335);
    check(1003, 670, 335);
}
