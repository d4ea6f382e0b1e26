//! The fp8 weights path (`--quantization fp8`): the per-tensor e4m3 quantizer (kernels/
//! quant_fp8.cu, `kernels::quantize_e4m3`), `gemv_fp8` (decode rows over e4m3 weights) and the
//! cuBLASLt fp8 GEMM behind `gemm::linear` (more rows: activations quantized with a dynamic
//! scale, both scales applied in the epilogue). The references dequantize what the GPU quantized,
//! so they check the arithmetic tightly; the quantization itself is checked bit for bit against
//! the CPU quantizer.

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::fp8_gemm::{E4m3Quantizer, Fp8Gemm};
use brook::executor::cuda::gemm::{self, Weight};
use brook::executor::cuda::kernels::{self, GemvParams, GEMV_MAX_M};
use half::bf16;
use rand_chacha::ChaCha8Rng;

use crate::gemv::{check_both_outputs, gemv_params};
use crate::harness::{
    assert_close, dev, e4m3, e4m3_to_f32, matmul_ref, poisoned, rand_bf16, read, read_bf16,
    read_e4m3, setup, to_f32,
};

/// `rows` x `k` bf16 with rows of very different magnitudes and (from 4 rows) one row of zeros
/// and one with a single large value.
fn rows_of_scales(r: &mut ChaCha8Rng, rows: usize, k: usize) -> Vec<bf16> {
    let mut x = Vec::with_capacity(rows * k);
    for i in 0..rows {
        let scale = [1.0, 0.01, 30.0, 1e-4][i % 4];
        x.extend(rand_bf16(r, k, scale));
    }
    if rows > 3 {
        x[2 * k..3 * k].fill(bf16::ZERO);
        x[3 * k + 7] = bf16::from_f32(1000.0);
    }
    x
}

/// (e4m3 bytes, [scale, 1 / scale]) of `x` as quant_fp8.cu defines them.
fn quant_ref(x: &[f32]) -> (Vec<u8>, [f32; 2]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (s, inv) = match amax > 0.0 {
        true => (amax / 448.0, 448.0 / amax),
        false => (1.0, 1.0),
    };
    (x.iter().map(|v| e4m3(v * inv)).collect(), [s, inv])
}

/// Device e4m3 values and [scale, inverse] of the `n` bf16 of `x`.
fn quantize(g: &Gpu, x: &DevBuf, n: usize, quant: &E4m3Quantizer) -> (DevBuf, DevBuf) {
    let (q, scale) = (poisoned::<u8>(g, n), poisoned::<f32>(g, 2));
    unsafe { quant.run(g, (x.ptr(), q.ptr(), scale.ptr()), n).unwrap() };
    (q, scale)
}

/// The values the device's e4m3 tensor stands for: byte value x scale.
fn dequant(g: &Gpu, q: &DevBuf, s: &DevBuf, n: usize) -> Vec<f32> {
    let s = read::<f32>(g, s, 2)[0];
    read_e4m3(g, q, n).into_iter().map(|v| v * s).collect()
}

#[test]
fn quantize_e4m3_matches_the_cpu_quantizer_bit_for_bit() {
    let Some((g, mut r)) = setup(61) else { return };
    let sc = E4m3Quantizer::new(&g).unwrap();
    // One CTA, several, and more chunks than AMAX_MAX_CTAS CTAs cover (grid-stride); then the
    // same counter again (it must have been reset) and a tensor of zeros.
    for (rows, k) in [(3, 512), (37, 1336), (1100, 2048), (5, 1336)] {
        let x = rows_of_scales(&mut r, rows, k);
        let (want_q, want_s) = quant_ref(&to_f32(&x));
        let (q, s) = quantize(&g, &dev(&g, &x), rows * k, &sc);
        assert_eq!(read::<f32>(&g, &s, 2), want_s, "scale, {rows} x {k}");
        let got: Vec<u8> = read(&g, &q, rows * k);
        let bad = got.iter().zip(&want_q).filter(|(a, b)| a != b).count();
        assert_eq!(
            bad,
            0,
            "{bad} of {} e4m3 bytes differ, {rows} x {k}",
            rows * k
        );
        // The largest value lands on 448 (0x7e).
        assert!(got.iter().any(|b| b & 0x7f == 0x7e));
    }
    let zeros = vec![bf16::ZERO; 4096];
    let (q, s) = quantize(&g, &dev(&g, &zeros), 4096, &sc);
    assert_eq!(read::<f32>(&g, &s, 2), [1.0, 1.0]);
    assert!(read::<u8>(&g, &q, 4096).iter().all(|&b| b == 0));
}

#[test]
fn gemv_fp8_matches_the_dequantized_reference_for_each_row_count() {
    let Some((g, mut r)) = setup(62) else { return };
    let (n, k) = (1003, 1344);
    let w = rand_bf16(&mut r, n * k, 0.05);
    let (wq, ws) = quantize(&g, &dev(&g, &w), n * k, &E4m3Quantizer::new(&g).unwrap());
    let wf = dequant(&g, &wq, &ws, n * k);
    for m in 1..=GEMV_MAX_M {
        let x = rand_bf16(&mut r, m * k, 1.0);
        let want = matmul_ref(&to_f32(&x), &wf, m, n, k);
        let xb = dev(&g, &x);
        for split in [1, 2, 4, 8] {
            let p = GemvParams {
                w_scale: ws.ptr(),
                ..gemv_params(xb.ptr(), wq.ptr(), (m, n, k), split)
            };
            let what = format!("gemv_fp8 m={m} split {split}");
            check_both_outputs(&g, kernels::gemv_fp8, p, &want, &what);
        }
    }
}

/// `gemm::linear` over e4m3 weights: the gemv up to `GEMV_MAX_M` rows, cuBLASLt's fp8 GEMM above
/// (through an `Fp8Gemm`), against the product of what both operands quantize to; and,
/// looser, against the unquantized bf16 product (what quantization costs).
#[test]
fn fp8_linear_matches_the_dequantized_reference() {
    let Some((g, mut r)) = setup(63) else {
        return;
    };
    let (n, k) = (1000, 1344);
    let fp8 = Fp8Gemm::new(&g, 300, k).unwrap();
    let w = rand_bf16(&mut r, n * k, 0.05);
    let (wq, ws) = quantize(&g, &dev(&g, &w), n * k, &E4m3Quantizer::new(&g).unwrap());
    let wf = dequant(&g, &wq, &ws, n * k);
    let weight = Weight {
        ptr: wq.ptr(),
        scale: ws.ptr(),
    };
    for m in [3, 5, 64, 300] {
        let x = rand_bf16(&mut r, m * k, 1.0);
        let xf = to_f32(&x);
        // The GEMM sees x as the quantizer leaves it (the gemv reads x as is).
        let x_seen = match m <= GEMV_MAX_M {
            true => xf.clone(),
            false => {
                let (q, [s, _]) = quant_ref(&xf);
                q.into_iter().map(|b| e4m3_to_f32(b) * s).collect()
            }
        };
        let want = matmul_ref(&x_seen, &wf, m, n, k);
        let xb = dev(&g, &x);
        let (y16, y32) = (poisoned::<bf16>(&g, m * n), poisoned::<f32>(&g, m * n));
        unsafe {
            gemm::linear(&g, Some(&fp8), xb.ptr(), weight, y16.ptr(), m, n, k, false).unwrap();
            gemm::linear(&g, Some(&fp8), xb.ptr(), weight, y32.ptr(), m, n, k, true).unwrap();
        }
        let got = read::<f32>(&g, &y32, m * n);
        assert_close(&format!("fp8 linear m={m} f32"), &got, &want, 2e-3);
        assert_close(
            &format!("fp8 linear m={m} bf16"),
            &read_bf16(&g, &y16, m * n),
            &want,
            1e-2,
        );
        let exact = matmul_ref(&xf, &to_f32(&w), m, n, k);
        assert_close(&format!("fp8 linear m={m} vs bf16"), &got, &exact, 0.08);
    }
}
