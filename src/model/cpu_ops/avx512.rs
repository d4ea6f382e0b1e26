//! The streaming matmul's micro-kernel with 16-lane vectors (AVX-512F), for CPUs that run
//! 512-bit FMAs at full width (Zen 5, as the development box): twice the AVX2 kernel's
//! multiply-adds a cycle, which is what a verification's k + 1 rows are bound by once the
//! weights come from the cache (`Weights`: bf16). Each output is one 16-lane accumulator over
//! k in order, reduced in registers in one fixed order (`reduce16`: a store and 15 scalar adds
//! per output made one row slower than AVX2 at the draft's k = 192), then the tail: the same
//! operations whatever the tile, so a row's result does not depend on the other rows. Every
//! matmul of a CPU with AVX-512F runs here, whatever its row count.

use std::arch::x86_64::*;

use super::{Wt, MR, NR};

/// R rows of x against C rows of W.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and FMA; `x` holds R rows of `k`, `w` C rows of `k`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn micro<const R: usize, const C: usize, T: Wt>(
    x: &[f32],
    w: &[T],
    k: usize,
    out: &mut [[f32; NR]; MR],
) {
    debug_assert!(R <= MR && C <= NR && x.len() >= R * k && w.len() >= C * k);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let k16 = k / 16 * 16;
    // The next tile's rows of W (C rows on), fetched while this one computes (harmless past
    // the end: prefetches do not fault).
    let ahead = wp.wrapping_add(C * k);
    let mut p = 0;
    // One prefetch per 64-byte line of W.
    let line = 64 / std::mem::size_of::<T>();
    while p < k16 {
        if p % line == 0 {
            for c in 0..C {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(c * k + p).cast());
            }
        }
        let mut wv = [_mm512_setzero_ps(); C];
        for (c, v) in wv.iter_mut().enumerate() {
            *v = T::load16(wp.add(c * k + p));
        }
        for (r, a) in acc.iter_mut().enumerate() {
            let xv = _mm512_loadu_ps(xp.add(r * k + p));
            for c in 0..C {
                a[c] = _mm512_fmadd_ps(xv, wv[c], a[c]);
            }
        }
        p += 16;
    }
    for r in 0..R {
        for c in 0..C {
            let mut s = reduce16(acc[r][c]);
            for q in k16..k {
                s += x[r * k + q] * w[c * k + q].to_f32();
            }
            out[r][c] = s;
        }
    }
}

/// The sum of 16 lanes in registers, in `reduce8`'s order over `lane i + lane i + 8`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn reduce16(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    // ((h0 + h4) + (h2 + h6)) + ((h1 + h5) + (h3 + h7)).
    let s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
}
