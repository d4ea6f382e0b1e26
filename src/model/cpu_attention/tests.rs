//! Both kernels against an f64 reference on random inputs, outputs poisoned first; the
//! polynomial `exp` against f64's.

use super::*;
use crate::model::cpu_ops::tests::rand_vec;

/// softmax(q·K·scale)·V in f64 over the job's slots.
fn reference(j: &HeadJob<'_>, hd: usize) -> Vec<f64> {
    let slots: Vec<usize> = j.slots().collect();
    let s: Vec<f64> = slots
        .iter()
        .map(|&slot| {
            let k = &j.k_cache[slot * j.kv_dim + j.head_off..][..hd];
            j.q.iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * j.scale as f64
        })
        .collect();
    let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
    let sum: f64 = p.iter().sum();
    let mut o = vec![0f64; hd];
    for (&slot, &p) in slots.iter().zip(&p) {
        let v = &j.v_cache[slot * j.kv_dim + j.head_off..][..hd];
        for (o, &v) in o.iter_mut().zip(v) {
            *o += p / sum * v as f64;
        }
    }
    o
}

/// Every key count around the 4-key and 8-lane edges, several blocks through a shuffled table,
/// windows (keys not from 0), head sizes below, at and above the 64-column chunk, two kv heads;
/// scores spread wide (q scaled by 8) so the exponentials span many magnitudes.
#[test]
fn both_kernels_match_the_f64_reference() {
    let bs = 16;
    let table: Vec<u32> = vec![5, 2, 7, 0, 3, 6, 1, 4];
    let num_slots = 8 * bs;
    for hd in [8usize, 64, 72, 128, 136] {
        let kv_dim = 2 * hd;
        let k_cache = rand_vec(num_slots * kv_dim, hd as u64);
        let v_cache = rand_vec(num_slots * kv_dim, 7 + hd as u64);
        let q: Vec<f32> = rand_vec(hd, 3).iter().map(|x| x * 8.0).collect();
        for (first, ctx) in [
            (0, 1),
            (0, 3),
            (0, 4),
            (0, 5),
            (0, 8),
            (0, 13),
            (0, 17),
            (0, 100),
            (5, 37),
            (30, 128),
        ] {
            for head_off in [0, hd] {
                let job = HeadJob {
                    q: &q,
                    table: &table,
                    bs,
                    first,
                    ctx,
                    k_cache: &k_cache,
                    v_cache: &v_cache,
                    kv_dim,
                    head_off,
                    scale: 1.0 / (hd as f32).sqrt(),
                };
                let want = reference(&job, hd);
                let mut kernels: Vec<(&str, Vec<f32>)> = Vec::new();
                let mut scores = vec![f32::NAN; 3];
                let mut o = vec![f32::NAN; hd];
                attend(&job, &mut scores, &mut o);
                kernels.push(("portable", o));
                #[cfg(target_arch = "x86_64")]
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    let mut scores = vec![f32::NAN; 1000];
                    let mut o = vec![f32::NAN; hd];
                    // SAFETY: AVX2 and FMA checked; hd is a multiple of 8.
                    unsafe { fma::attend(&job, &mut scores, &mut o) };
                    kernels.push(("fma", o));
                }
                for (name, got) in kernels {
                    for (d, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (*g as f64 - w).abs() <= 2e-6 * (1.0 + w.abs()),
                            "{name} hd {hd} keys {first}..{ctx} head_off {head_off} col {d}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

/// The 8-lane exp within 2 ulp (relative 2.4e-7) of f64's over the range softmax uses, and
/// exactly 1 at 0.
#[cfg(target_arch = "x86_64")]
#[test]
fn polynomial_exp_is_within_two_ulp() {
    use std::arch::x86_64::*;
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return;
    }
    let xs: Vec<f32> = (0..200_000)
        .map(|i| -87.0 + 97.0 * i as f32 / 200_000.0)
        .chain([0.0, -0.0, 1e-8, -1e-8])
        .collect();
    let mut worst = 0f64;
    for c in xs.chunks(8) {
        let mut lanes = [0f32; 8];
        lanes[..c.len()].copy_from_slice(c);
        let mut out = [0f32; 8];
        // SAFETY: AVX2 and FMA checked above.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), fma::exp(_mm256_loadu_ps(lanes.as_ptr())));
        }
        for (&x, &y) in lanes.iter().zip(&out).take(c.len()) {
            let want = (x as f64).exp();
            worst = worst.max(((y as f64 - want) / want).abs());
        }
    }
    assert!(worst <= 2.4e-7, "worst relative error {worst:e}");
    let mut one = [0f32; 8];
    // SAFETY: as above.
    unsafe { _mm256_storeu_ps(one.as_mut_ptr(), fma::exp(_mm256_setzero_ps())) };
    assert_eq!(one, [1.0; 8]);
}
