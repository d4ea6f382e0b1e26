//! The matmul paths against an f64 reference, rows' independence, bf16 weights, the row ops.

use super::*;

/// Uniform values in [-0.5, 0.5) from a seeded LCG (also the attention tests' inputs).
pub(crate) fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn reference(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                .sum();
        }
    }
    out
}

/// Every path (streamed, sequential and parallel, every micro-kernel edge; gemm) against an
/// f64 reference, on shapes with ragged edges and k not a multiple of 8.
#[test]
fn matmul_matches_the_reference_on_every_path() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for &(m, n, k) in &[
        (1, 1, 1),
        (1, 7, 13),
        (1, 131, 384),
        (3, 5, 8),
        (5, 131, 384),
        (2, 4096, 64),
        (STREAM_MAX_ROWS, 67, 100),
        (STREAM_MAX_ROWS + 1, 67, 100),
        (70, 130, 385),
    ] {
        let (x, w) = (rand_vec(m * k, 1), rand_vec(n * k, 2));
        let want = reference(&x, m, &w, n, k);
        for par in [false, true] {
            let mut out = vec![f32::NAN; 3];
            let run = |out: &mut Vec<f32>| matmul_wt(&x, m, &w, n, k, out);
            if par {
                pool.install(|| run(&mut out));
            } else {
                run(&mut out);
            }
            assert_eq!(out.len(), m * n);
            for (g, w) in out.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{m}x{n}x{k} par={par}: {g} vs {w}"
                );
            }
        }
    }
}

/// Each micro-kernel this CPU has (AVX-512, AVX2, portable), every tile edge, f32 and bf16
/// weights, against the f64 reference; output poisoned first.
#[test]
fn every_micro_kernel_matches_the_reference() {
    let best = Isa::detect();
    let isas = [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&i| i == Isa::Portable || best == Isa::Avx512 || i == best);
    for isa in isas {
        for &(m, n, k) in &[
            (1, 19, 13),
            (2, 17, 40),
            (5, 19, 392),
            (6, 8, 16),
            (7, 11, 100),
        ] {
            let x = rand_vec(m * k, 8);
            let w = rand_vec(n * k, 9);
            let bits: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let wide: Vec<f32> = bits.iter().map(|&b| b.to_f32()).collect();
            let want = reference(&x, m, &wide, n, k);
            let mut a = vec![f32::NAN; n * m];
            let mut b = vec![f32::NAN; n * m];
            block(isa, &x, m, &wide, n, k, &mut a);
            block(isa, &x, m, &bits, n, k, &mut b);
            for i in 0..m {
                for j in 0..n {
                    let (g, w) = (a[j * m + i], want[i * n + j]);
                    assert!(
                        (g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{isa:?} {m}x{n}x{k}: {g} vs {w}"
                    );
                    assert_eq!(g.to_bits(), b[j * m + i].to_bits(), "{isa:?} bf16");
                }
            }
        }
    }
}

/// A row's streamed result is bit-for-bit the same whatever the other rows: verification
/// over k + 1 rows gives the logits of k + 1 separate one-row steps.
#[test]
fn a_streamed_row_does_not_depend_on_the_other_rows() {
    let (m, n, k) = (STREAM_MAX_ROWS, 300, 392);
    let (x, w) = (rand_vec(m * k, 3), rand_vec(n * k, 4));
    let mut all = Vec::new();
    matmul_wt(&x, m, &w, n, k, &mut all);
    let mut one = Vec::new();
    for i in 0..m {
        for rows in [1, 2, 3] {
            let take = rows.min(m - i);
            matmul_wt(&x[i * k..(i + take) * k], take, &w, n, k, &mut one);
            assert!(
                one[..n]
                    .iter()
                    .zip(&all[i * n..(i + 1) * n])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "row {i} alone (with {take} rows) differs"
            );
        }
    }
}

/// bf16 weights (stored as their bits) give the f32 path's products bit for bit on every
/// path (streamed 1..32 rows, sequential and parallel; gemm by panels), and `Dense` keeps
/// bf16 only when that is exact.
#[test]
fn bf16_weights_match_their_f32_widening_bit_for_bit() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for &(m, n, k) in &[(1, 7, 13), (2, 131, 384), (5, 600, 392), (33, 1100, 100)] {
        let x = rand_vec(m * k, 5);
        let bits: Vec<u16> = rand_vec(n * k, 6)
            .iter()
            .map(|v| (v.to_bits() >> 16) as u16)
            .collect();
        let wide: Vec<f32> = bits.iter().map(|&b| b.to_f32()).collect();
        for par in [false, true] {
            let (mut a, mut b) = (vec![f32::NAN; 2], vec![f32::NAN; 5]);
            let run = |a: &mut Vec<f32>, b: &mut Vec<f32>| {
                matmul_wt(&x, m, &wide, n, k, a);
                matmul_wt(&x, m, &bits, n, k, b);
            };
            if par {
                pool.install(|| run(&mut a, &mut b));
            } else {
                run(&mut a, &mut b);
            }
            assert_eq!(a.len(), m * n);
            assert!(
                a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{m}x{n}x{k} par={par}"
            );
        }
        let d = Dense::new(wide.clone(), n, k, None);
        assert!(d.is_bf16());
        let mut row = Vec::new();
        d.push_row(n - 1, &mut row);
        assert_eq!(row, wide[(n - 1) * k..]);
    }
    let mut w = rand_vec(12, 7);
    w[3] = 1.0 + f32::EPSILON;
    assert!(!Dense::new(w, 3, 4, None).is_bf16());
}

/// The portable path's bf16 dot (no AVX2 / AVX-512: the SIMD kernels above may be the ones
/// matmul_wt takes here) widens as it reads, bit for bit the f32 dot of the widened row.
#[test]
fn portable_bf16_dot_equals_the_widened_dot_bit_for_bit() {
    for k in [1, 7, 8, 9, 64, 391, 4096] {
        let a = rand_vec(k, 11 + k as u64);
        let bits: Vec<u16> = rand_vec(k, 12 + k as u64)
            .iter()
            .map(|v| (v.to_bits() >> 16) as u16)
            .collect();
        let wide: Vec<f32> = bits.iter().map(|&b| b.to_f32()).collect();
        let (got, want) = (dot_wt(&a, &bits), dot(&a, &wide));
        assert!(got.is_finite() && got != 0.0, "k {k}: {got}");
        assert_eq!(got.to_bits(), want.to_bits(), "k {k}: {got} vs {want}");
    }
}

#[test]
fn bias_norm_and_swiglu() {
    let d = Dense::new(vec![1.0, 2.0, 3.0, 4.0], 2, 2, Some(vec![0.5, -1.0]));
    let mut out = Vec::new();
    d.forward(&[1.0, 1.0, 0.0, 1.0], 2, &mut out);
    assert_eq!(out, vec![3.5, 6.0, 2.5, 3.0]);
    rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut out);
    let inv = (12.5f32).sqrt().recip();
    assert_eq!(out, vec![3.0 * inv * 1.0, 4.0 * inv * 2.0]);
    swiglu(&[0.0, 2.0, 3.0, 5.0], 2, &mut out);
    assert_eq!(out, vec![0.0, 2.0 / (1.0 + (-2.0f32).exp()) * 5.0]);
}
