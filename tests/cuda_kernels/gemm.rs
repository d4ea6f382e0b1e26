//! `gemm::linear`: the cuBLAS linear layer with bf16 and fp32 outputs, also on a sibling stream.

use brook::executor::cuda::gemm::{self, Weight};
use brook::executor::cuda::kernels::{self, FillParams};
use half::bf16;

use crate::harness::{
    assert_close, dev, matmul_ref, poisoned, rand_bf16, rand_f32, read, read_bf16, setup, to_f32,
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

/// `gemm::linear_add`: y += x · wᵀ into an fp32 y holding random values (the residual stream),
/// at a prefill's rows and at rows the gemv kernels would take (it stays on cuBLAS).
#[test]
fn gemm_adds_into_f32_output() {
    let Some((g, mut r)) = setup(52) else { return };
    for (m, n, k) in [(37, 301, 200), (3, 256, 512)] {
        let x = rand_bf16(&mut r, m * k, 1.0);
        let w = rand_bf16(&mut r, n * k, 1.0);
        let y0 = rand_f32(&mut r, m * n, 8.0);
        let prod = matmul_ref(&to_f32(&x), &to_f32(&w), m, n, k);
        let want: Vec<f32> = y0.iter().zip(&prod).map(|(a, b)| a + b).collect();
        let (xb, wb, yb) = (dev(&g, &x), dev(&g, &w), dev(&g, &y0));
        unsafe { gemm::linear_add(&g, xb.ptr(), Weight::bf16(wb.ptr()), yb.ptr(), (m, n, k)) }
            .unwrap();
        assert_close(
            &format!("gemm += {m}x{n}x{k}"),
            &read::<f32>(&g, &yb, m * n),
            &want,
            1e-4,
        );
    }
    // e4m3 weights are refused rather than read as bf16.
    let w = Weight { ptr: 0, scale: 1 };
    assert!(unsafe { gemm::linear_add(&g, 0, w, 0, (4, 8, 8)) }.is_err());
}

/// A sibling handle (`Gpu::sibling`: the second stream of `gpu-bench overlap`) runs cuBLAS and
/// brook's kernels on its own stream, queued beside the primary's work, with the same results.
#[test]
fn sibling_stream_computes_beside_the_primary() {
    let Some((g, mut r)) = setup(51) else { return };
    let (_, highest) = cudarc::driver::result::stream::get_priority_range().unwrap();
    let s = g.sibling(Some(highest)).unwrap();
    let (m, n, k) = (64, 512, 384);
    let x = rand_bf16(&mut r, m * k, 1.0);
    let w = rand_bf16(&mut r, n * k, 1.0);
    let want = matmul_ref(&to_f32(&x), &to_f32(&w), m, n, k);
    let (xb, wb) = (dev(&g, &x), dev(&g, &w));
    let ys = [poisoned::<f32>(&g, m * n), poisoned::<f32>(&g, m * n)];
    let fills = [poisoned::<bf16>(&g, 4099), poisoned::<bf16>(&g, 4099)];
    // The inputs and the poison land before the sibling's stream reads or writes them.
    g.sync().unwrap();
    for (gpu, y, fill) in [(&g, &ys[0], &fills[0]), (&s, &ys[1], &fills[1])] {
        let p = FillParams {
            out: fill.ptr(),
            n: 4099,
            seed: 3,
            scale: 1.0,
            offset: 0.0,
        };
        unsafe {
            for _ in 0..4 {
                gemm::linear(
                    gpu,
                    None,
                    xb.ptr(),
                    Weight::bf16(wb.ptr()),
                    y.ptr(),
                    m,
                    n,
                    k,
                    true,
                )
                .unwrap();
            }
            kernels::fill_uniform(gpu, &p).unwrap();
        }
    }
    s.sync().unwrap();
    for (i, y) in ys.iter().enumerate() {
        assert_close(
            &format!("stream {i}"),
            &read::<f32>(&g, y, m * n),
            &want,
            1e-4,
        );
    }
    let [a, b] = fills.map(|f| read::<u16>(&g, &f, 4099));
    assert!(a == b, "fill_uniform differs between the streams");
    assert!(
        a.iter().any(|&v| v != 0xffff),
        "fill_uniform left the poison"
    );
}
