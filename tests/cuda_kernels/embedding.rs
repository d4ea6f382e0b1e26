//! `embedding`: token rows gathered from the bf16 table into the fp32 residual stream.

use brook::executor::cuda::kernels::{self, EmbeddingParams};
use rand::Rng;

use crate::harness::{dev, poisoned, rand_bf16, read, setup, to_f32};

#[test]
fn embedding_gathers_rows() {
    let Some((g, mut r)) = setup(1) else { return };
    let (vocab, d, t) = (1003, 392, 37);
    let table = rand_bf16(&mut r, vocab * d, 1.0);
    let tokens: Vec<u32> = (0..t).map(|_| r.random_range(0..vocab as u32)).collect();
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
    };
    unsafe { kernels::embedding(&g, &p).unwrap() };
    let got: Vec<f32> = read(&g, &out, t * d);
    for (i, &tok) in tokens.iter().enumerate() {
        let want = to_f32(&table[tok as usize * d..(tok as usize + 1) * d]);
        assert_eq!(&got[i * d..(i + 1) * d], &want[..], "row {i}");
    }
}
