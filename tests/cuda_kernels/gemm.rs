//! `gemm::linear`: the cuBLAS linear layer with bf16 and fp32 outputs.

use brook::executor::cuda::gemm::{self, Weight};
use half::bf16;

use crate::harness::{
    assert_close, dev, matmul_ref, poisoned, rand_bf16, read, read_bf16, setup, to_f32,
};

#[test]
fn gemm_bf16_matches_reference() {
    let Some((g, mut r)) = setup(50) else { return };
    let (m, n, k) = (37, 301, 200);
    let x = rand_bf16(&mut r, m * k, 1.0);
    let w = rand_bf16(&mut r, n * k, 1.0);
    let want = matmul_ref(&to_f32(&x), &to_f32(&w), m, n, k);
    let (xb, wb) = (dev(&g, &x), dev(&g, &w));
    let y16 = poisoned::<bf16>(&g, m * n);
    let y32 = poisoned::<f32>(&g, m * n);
    unsafe {
        gemm::linear(
            &g,
            None,
            xb.ptr(),
            Weight::bf16(wb.ptr()),
            y16.ptr(),
            m,
            n,
            k,
            false,
        )
        .unwrap();
        gemm::linear(
            &g,
            None,
            xb.ptr(),
            Weight::bf16(wb.ptr()),
            y32.ptr(),
            m,
            n,
            k,
            true,
        )
        .unwrap();
    }
    assert_close("gemm bf16 out", &read_bf16(&g, &y16, m * n), &want, 8e-3);
    assert_close("gemm f32 out", &read::<f32>(&g, &y32, m * n), &want, 1e-4);
}
