//! The CPU forward's paged attention (`model::llama`): every (token, query head) of a flattened
//! batch attends over its sequence's K/V, read through the block table.
//!
//! Two kernels with one contract (`o = softmax(q · Kᵀ · scale) · V`, f32, three passes over
//! the keys: scores and their max, exponentials and their sum, the weighted sum of V):
//! - `fma::attend` (x86_64 with AVX2 and FMA, head_dim a multiple of 8): four keys' dot
//!   products per step with one horizontal reduction between them, `exp` as an 8-lane
//!   polynomial (`fma::exp`, ≤ 2 ulp), V summed with FMAs. The scalar `expf` per key was ≈ 15 %
//!   of the kernel's time at a few hundred keys, the per-key horizontal sum most of the rest.
//! - `attend`, portable, with `f32::exp`: other CPUs and head sizes.
//!
//! The two round differently (FMA contraction, the polynomial), so their results agree within
//! a tolerance (tests: against an f64 reference), not bit for bit. Each (token, head) is one
//! fixed sequence of operations whatever the rest of the batch, so a row's result does not
//! depend on the other rows: k + 1 verified rows equal k + 1 one-row steps.

use rayon::prelude::*;

use crate::model::config::ModelConfig;
use crate::step::BatchInput;

/// Multiply-adds (query · key and weight · value, over every token and head) from which
/// attention runs in parallel.
const PAR_MIN_ATTENTION_MACS: usize = 1 << 18;

/// Per-token attention inputs resolved once per step and shared by all layers.
pub(crate) struct AttentionPlan<'a> {
    /// For each token: its position (it attends to positions `0..=pos`) and its sequence's block
    /// table.
    tokens: Vec<(usize, &'a [u32])>,
    /// Keys read by one query head over all the tokens (attention's work, for the fork decision).
    keys: usize,
    /// Attention reads a token's last `window` positions.
    window: usize,
}

impl<'a> AttentionPlan<'a> {
    pub(crate) fn new(batch: &'a BatchInput, window: usize) -> Self {
        let mut tokens = Vec::with_capacity(batch.num_tokens());
        let mut row = 0;
        for s in &batch.seqs {
            for _ in 0..s.query_len {
                tokens.push((batch.positions[row] as usize, batch.block_table(s)));
                row += 1;
            }
        }
        // Keys are at most the window (attention reads the last `window` positions).
        let keys = tokens.iter().map(|&(pos, _)| (pos + 1).min(window)).sum();
        AttentionPlan {
            tokens,
            keys,
            window,
        }
    }
}

/// Causal attention of every (token, query head) of the batch over its sequence's paged K/V
/// (`[slot, kv_head, head_dim]` in `k_cache`/`v_cache`, `slot = block * bs + offset`). Query
/// head `h` reads kv head `h / (num_heads / num_kv_heads)` (GQA; MQA and MHA are the extremes).
/// `qkv` is `[num_tokens, q | k | v]`, `out` `[num_tokens, q_dim]`.
pub(crate) fn paged_attention(
    qkv: &[f32],
    out: &mut [f32],
    (k_cache, v_cache): (&[f32], &[f32]),
    bs: usize,
    c: &ModelConfig,
    plan: &AttentionPlan,
) {
    let (hd, heads) = (c.head_dim, c.num_attention_heads);
    let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
    let row_len = q_dim + 2 * kv_dim;
    let group = heads / c.num_key_value_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    #[cfg(target_arch = "x86_64")]
    let fast = hd % 8 == 0 && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    let head = |scores: &mut Vec<f32>, (i, o): (usize, &mut [f32])| {
        let (t, h) = (i / heads, i % heads);
        let (pos, table) = plan.tokens[t];
        let job = HeadJob {
            q: &qkv[t * row_len + h * hd..][..hd],
            table,
            bs,
            // Keys first..=pos: the whole prefix, or the last `window` positions.
            first: (pos + 1).saturating_sub(plan.window),
            ctx: pos + 1,
            k_cache,
            v_cache,
            kv_dim,
            head_off: (h / group) * hd,
            scale,
        };
        #[cfg(target_arch = "x86_64")]
        if fast {
            // SAFETY: the CPU has AVX2 and FMA and head_dim is a multiple of 8 (checked above).
            unsafe { fma::attend(&job, scores, o) };
            return;
        }
        attend(&job, scores, o);
    };
    // Parallel over (token, head) when there is enough to share: a fork costs what a few
    // hundred thousand multiply-adds do (a short single-stream decode stays on one thread).
    if 2 * plan.keys * heads * hd >= PAR_MIN_ATTENTION_MACS {
        out.par_chunks_mut(hd)
            .enumerate()
            .for_each_init(Vec::<f32>::new, head);
    } else {
        let mut scores = Vec::new();
        out.chunks_mut(hd)
            .enumerate()
            .for_each(|item| head(&mut scores, item));
    }
}

/// One query head's attention: its query, and where its keys are.
struct HeadJob<'a> {
    q: &'a [f32],
    table: &'a [u32],
    bs: usize,
    /// Keys `first..ctx`.
    first: usize,
    ctx: usize,
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    kv_dim: usize,
    head_off: usize,
    scale: f32,
}

impl HeadJob<'_> {
    /// The slots of positions `first..ctx` as runs of consecutive slots, one per block (no
    /// division per key).
    fn runs(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        let bs = self.bs;
        (self.first / bs..self.ctx.div_ceil(bs)).map(move |b| {
            let base = self.table[b] as usize * bs;
            let (lo, hi) = ((b * bs).max(self.first), ((b + 1) * bs).min(self.ctx));
            base + lo - b * bs..base + hi - b * bs
        })
    }

    fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.runs().flatten()
    }
}

/// The portable kernel: `o = softmax(q · Kᵀ · scale) · V` over the job's keys, in f32.
fn attend(j: &HeadJob<'_>, scores: &mut Vec<f32>, o: &mut [f32]) {
    let hd = o.len();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for slot in j.slots() {
        let k = &j.k_cache[slot * j.kv_dim + j.head_off..][..hd];
        let s = crate::model::cpu_ops::dot(j.q, k) * j.scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0.0;
    o.fill(0.0);
    for (slot, s) in j.slots().zip(scores.iter()) {
        let p = (s - max).exp();
        sum += p;
        let v = &j.v_cache[slot * j.kv_dim + j.head_off..][..hd];
        for (o, &v) in o.iter_mut().zip(v) {
            *o += p * v;
        }
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|x| *x *= inv);
}

#[cfg(target_arch = "x86_64")]
mod fma {
    use std::arch::x86_64::*;

    use super::HeadJob;

    /// Sum of the 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// `e^x` on 8 lanes (Cephes' expf: x = n·ln2 + r, |r| ≤ ln2/2, a degree-5 polynomial for
    /// e^r, 2^n through the exponent bits); relative error ≤ 2 ulp for x in [-87.3, 88.3],
    /// e^-87.3 (≈ 1e-38, nothing next to the max's 1) below that.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.336_54)),
            _mm256_set1_ps(88.376_26),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        // ln2 in two parts, so n·ln2_hi is exact.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let p = _mm256_fmadd_ps(
            p,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_mul_ps(p, pow2)
    }

    /// `q · k` over `hd` floats (a multiple of 8), 8 lanes, not reduced.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot8(q: *const f32, k: *const f32, hd: usize) -> __m256 {
        let mut a = _mm256_setzero_ps();
        let mut b = _mm256_setzero_ps();
        let mut d = 0;
        while d + 16 <= hd {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d)), _mm256_loadu_ps(k.add(d)), a);
            b = _mm256_fmadd_ps(
                _mm256_loadu_ps(q.add(d + 8)),
                _mm256_loadu_ps(k.add(d + 8)),
                b,
            );
            d += 16;
        }
        if d < hd {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d)), _mm256_loadu_ps(k.add(d)), a);
        }
        _mm256_add_ps(a, b)
    }

    /// The kernel of the module's header.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `o.len()` (head_dim) is a multiple of 8 and the job's
    /// slots lie in its caches.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn attend(j: &HeadJob<'_>, scores: &mut Vec<f32>, o: &mut [f32]) {
        let hd = o.len();
        debug_assert!(hd % 8 == 0 && j.q.len() == hd);
        let n = j.ctx - j.first;
        scores.clear();
        scores.reserve(n + 8);
        let q = j.q.as_ptr();
        let (kc, vc) = (j.k_cache, j.v_cache);
        let key = |slot: usize| {
            assert!((slot + 1) * j.kv_dim <= kc.len());
            kc.as_ptr().add(slot * j.kv_dim + j.head_off)
        };
        // Scores: four keys at a time, their four 8-lane sums reduced together.
        let sp = scores.as_mut_ptr();
        let mut w = 0;
        for run in j.runs() {
            let mut s = run.start;
            while s + 4 <= run.end {
                let a0 = dot8(q, key(s), hd);
                let a1 = dot8(q, key(s + 1), hd);
                let a2 = dot8(q, key(s + 2), hd);
                let a3 = dot8(q, key(s + 3), hd);
                // hadd pairs within each 128-bit half; then the halves added: lanes 0..4 are
                // the four keys' sums.
                let h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
                let four = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
                _mm_storeu_ps(sp.add(w), _mm_mul_ps(four, _mm_set1_ps(j.scale)));
                w += 4;
                s += 4;
            }
            while s < run.end {
                *sp.add(w) = hsum(dot8(q, key(s), hd)) * j.scale;
                w += 1;
                s += 1;
            }
        }
        debug_assert_eq!(w, n);
        scores.set_len(n);
        let mut maxv = _mm256_set1_ps(f32::NEG_INFINITY);
        let chunks = scores.chunks_exact(8);
        let mut max = chunks
            .remainder()
            .iter()
            .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        for c in chunks {
            maxv = _mm256_max_ps(maxv, _mm256_loadu_ps(c.as_ptr()));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), maxv);
        max = lanes.iter().fold(max, |m, &s| m.max(s));
        // Exponentials in place, and their sum (the tail padded with -inf → e^… = 0).
        let m = _mm256_set1_ps(max);
        let mut sumv = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let p = exp(_mm256_sub_ps(_mm256_loadu_ps(sp.add(i)), m));
            _mm256_storeu_ps(sp.add(i), p);
            sumv = _mm256_add_ps(sumv, p);
            i += 8;
        }
        if i < n {
            let mut tail = [f32::NEG_INFINITY; 8];
            tail[..n - i].copy_from_slice(&scores[i..n]);
            let p = exp(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), m));
            let p = _mm256_blendv_ps(
                _mm256_setzero_ps(),
                p,
                _mm256_cmp_ps::<_CMP_GT_OQ>(
                    _mm256_loadu_ps(tail.as_ptr()),
                    _mm256_set1_ps(f32::NEG_INFINITY),
                ),
            );
            _mm256_storeu_ps(tail.as_mut_ptr(), p);
            scores[i..n].copy_from_slice(&tail[..n - i]);
            sumv = _mm256_add_ps(sumv, p);
        }
        let inv = _mm256_set1_ps(1.0 / hsum(sumv));
        // o = Σ p·v, 64 columns (8 accumulators) at a time.
        let op = o.as_mut_ptr();
        let mut c0 = 0;
        while c0 < hd {
            let cols = (hd - c0).min(64) / 8;
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut i = 0;
            for run in j.runs() {
                for slot in run {
                    assert!((slot + 1) * j.kv_dim <= vc.len());
                    let v = vc.as_ptr().add(slot * j.kv_dim + j.head_off + c0);
                    let p = _mm256_set1_ps(*sp.add(i));
                    for (c, a) in acc.iter_mut().enumerate().take(cols) {
                        *a = _mm256_fmadd_ps(p, _mm256_loadu_ps(v.add(8 * c)), *a);
                    }
                    i += 1;
                }
            }
            for (c, a) in acc.iter().enumerate().take(cols) {
                _mm256_storeu_ps(op.add(c0 + 8 * c), _mm256_mul_ps(*a, inv));
            }
            c0 += cols * 8;
        }
    }
}

#[cfg(test)]
mod tests;
