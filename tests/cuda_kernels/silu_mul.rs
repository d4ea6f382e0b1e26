//! `silu_mul`: SiLU(gate) × up from the fp32 gate|up GEMM output.

use brook::executor::cuda::kernels::{self, SiluMulParams};
use half::bf16;

use crate::harness::{assert_close, dev, poisoned, rand_f32, read_bf16, setup};

/// The 4-wide path (inter % 4 == 0, up to Llama-2-7B's 11008) and the element-by-element one.
#[test]
fn silu_mul_matches_reference() {
    let Some((g, mut r)) = setup(3) else { return };
    for (t, inter) in [(13, 1000), (5, 1002), (3, 1001), (2, 11008)] {
        let gu = rand_f32(&mut r, t * 2 * inter, 4.0);
        let (gb, out) = (dev(&g, &gu), poisoned::<bf16>(&g, t * inter));
        let p = SiluMulParams {
            gate_up: gb.ptr(),
            out: out.ptr(),
            num_tokens: t as i32,
            inter: inter as i32,
        };
        unsafe { kernels::silu_mul(&g, &p).unwrap() };
        let f = gu;
        let want: Vec<f32> = (0..t)
            .flat_map(|i| {
                let row = &f[i * 2 * inter..(i + 1) * 2 * inter];
                (0..inter).map(move |j| row[j] / (1.0 + (-row[j]).exp()) * row[inter + j])
            })
            .collect();
        assert_close(
            &format!("silu_mul {t}x{inter}"),
            &read_bf16(&g, &out, t * inter),
            &want,
            5e-3,
        );
    }
}
