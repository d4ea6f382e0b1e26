//! `fill_uniform`: the synthetic-weight generator.

use brook::executor::cuda::kernels::{self, FillParams};
use half::bf16;

use crate::harness::{gpu, poisoned, read_bf16};

#[test]
fn fill_uniform_spans_its_range() {
    let Some(g) = gpu() else { return };
    let n = 1_000_003;
    let out = poisoned::<bf16>(&g, n);
    let p = FillParams {
        out: out.ptr(),
        n: n as u64,
        seed: 9,
        scale: 0.5,
        offset: 1.0,
    };
    unsafe { kernels::fill_uniform(&g, &p).unwrap() };
    let v = read_bf16(&g, &out, n);
    assert!(v.iter().all(|x| (0.5..=1.5).contains(x)), "out of range");
    let mean = v.iter().map(|x| *x as f64).sum::<f64>() / n as f64;
    assert!((mean - 1.0).abs() < 2e-3, "mean {mean}");
    let distinct: std::collections::HashSet<u16> =
        v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect();
    assert!(distinct.len() > 100, "{} distinct values", distinct.len());
}
