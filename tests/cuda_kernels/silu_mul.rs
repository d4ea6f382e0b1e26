//! `silu_mul`: SiLU(gate) × up from the gate|up GEMM output, fp32 or bf16 (`silu_mul_bf16`).

use brook::executor::cuda::device::Gpu;
use brook::executor::cuda::kernels::{self, SiluMulParams};
use half::bf16;
use rand_chacha::ChaCha8Rng;

use crate::harness::{assert_close, dev, poisoned, rand_f32, read_bf16, setup, to_f32};

/// The 4-wide path (inter % 4 == 0, up to Llama-2-7B's 11008) and the element-by-element one,
/// over fp32 and bf16 input.
#[test]
fn silu_mul_matches_reference() {
    let Some((g, mut r)) = setup(3) else { return };
    for bf16_in in [false, true] {
        for (t, inter) in [(13, 1000), (5, 1002), (3, 1001), (2, 11008)] {
            check_silu_mul(&g, &mut r, t, inter, bf16_in);
        }
    }
}

/// One launch against the reference, which reads the values the kernel reads (with `bf16_in`,
/// the random input rounded to bf16).
fn check_silu_mul(g: &Gpu, r: &mut ChaCha8Rng, t: usize, inter: usize, bf16_in: bool) {
    let mut f = rand_f32(r, t * 2 * inter, 4.0);
    let input = if bf16_in {
        let b: Vec<bf16> = f.iter().map(|&x| bf16::from_f32(x)).collect();
        f = to_f32(&b);
        dev(g, &b)
    } else {
        dev(g, &f)
    };
    let out = poisoned::<bf16>(g, t * inter);
    let p = SiluMulParams {
        gate_up: input.ptr(),
        out: out.ptr(),
        num_tokens: t as i32,
        inter: inter as i32,
    };
    unsafe { kernels::silu_mul(g, &p, bf16_in).unwrap() };
    let want: Vec<f32> = (0..t)
        .flat_map(|i| {
            let row = &f[i * 2 * inter..(i + 1) * 2 * inter];
            (0..inter).map(move |j| row[j] / (1.0 + (-row[j]).exp()) * row[inter + j])
        })
        .collect();
    assert_close(
        &format!("silu_mul {t}x{inter} bf16 in {bf16_in}"),
        &read_bf16(g, &out, t * inter),
        &want,
        5e-3,
    );
}
