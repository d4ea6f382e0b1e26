//! The f32 kernels of the CPU forward (`model::llama`), on plain slices: `x · Wᵀ` for a linear
//! layer, RMSNorm, SwiGLU, the residual add.
//!
//! Why not candle's matmul: a decode step (1 row per sequence) and a verification (k + 1 rows) are
//! bound by reading the weights once, but candle's CPU matmul packs the weight panel on every
//! call (so k + 1 rows cost ≈ 3× one row) and asks for the machine's core count on every call
//! (on Linux that reads /proc/cpuinfo: ≈ 10 % of a decode step of the demo model). Up to
//! `STREAM_MAX_ROWS` rows we stream the weight once, each row of W meeting every row of x while
//! it is in L1 (`stream`); more rows (prefill chunks, large decode batches) go to `gemm`, which
//! is compute-bound there and worth its packing.
//!
//! Each output of `stream` is one fixed sequence of operations (an 8-lane accumulator over k in
//! order, reduced in a fixed order, then the tail), whatever the number of rows and wherever the
//! row falls in a tile: a row's result does not depend on the other rows of the batch.

use candle_core::Tensor;
use candle_nn::Linear;
use rayon::prelude::*;

/// Rows at most this many go through the weight-streaming kernel; more through `gemm`.
pub const STREAM_MAX_ROWS: usize = 32;
/// Multiply-adds below which a kernel runs on the calling thread: a rayon fork costs a few
/// microseconds, what ≈ 100k multiply-adds take on one core (the draft model's layers are
/// below it at one row).
const PAR_MIN_MACS: usize = 1 << 15;
/// Rows of W per parallel task of `stream`.
const STREAM_CHUNK: usize = 64;
/// Rows of x per parallel task of the row-wise ops (norms, activations).
const ROWS_PER_TASK: usize = 64;

/// A linear layer: weight `[n, k]` row-major (PyTorch's `[out_features, in_features]`), bias `[n]`.
pub struct Dense {
    w: Weights,
    n: usize,
    k: usize,
    bias: Option<Vec<f32>>,
}

/// A weight matrix's storage: bf16 when every value is one (a bf16 checkpoint, which the loader
/// widens to f32), else f32. A one-row matmul is bound by reading the weights, so half the
/// bytes is ≈ half the time (the demo target: 44 → 22 MB a step, which then fits the L3), and
/// the products are the same: bf16 → f32 is exact, the kernel widens each vector it loads.
enum Weights {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl Weights {
    fn new(w: Vec<f32>) -> Self {
        if w.iter().all(|v| v.to_bits() & 0xffff == 0) {
            Weights::Bf16(w.iter().map(|v| (v.to_bits() >> 16) as u16).collect())
        } else {
            Weights::F32(w)
        }
    }
}

impl Dense {
    /// `w` is kept as bf16 when that is exact (`Weights`).
    pub fn new(w: Vec<f32>, n: usize, k: usize, bias: Option<Vec<f32>>) -> Self {
        assert_eq!(w.len(), n * k, "weight is not [{n}, {k}]");
        assert!(
            bias.as_ref().is_none_or(|b| b.len() == n),
            "bias is not [{n}]"
        );
        Dense {
            w: Weights::new(w),
            n,
            k,
            bias,
        }
    }

    /// Whether the weights are held as bf16.
    pub fn is_bf16(&self) -> bool {
        matches!(self.w, Weights::Bf16(_))
    }

    /// Appends row `i` of W (as f32) to `out`: an embedding lookup.
    pub fn push_row(&self, i: usize, out: &mut Vec<f32>) {
        let r = i * self.k..(i + 1) * self.k;
        match &self.w {
            Weights::F32(w) => out.extend_from_slice(&w[r]),
            Weights::Bf16(w) => out.extend(w[r].iter().map(|&b| Wt::to_f32(b))),
        }
    }

    /// From candle's `Linear` (weight `[n, k]`).
    pub fn from_linear(l: &Linear) -> candle_core::Result<Self> {
        let (n, k) = l.weight().dims2()?;
        let w = to_vec(l.weight())?;
        let bias = l.bias().map(to_vec).transpose()?;
        Ok(Dense::new(w, n, k, bias))
    }

    pub fn out_features(&self) -> usize {
        self.n
    }

    /// `out[m, n] = x[m, k] · Wᵀ (+ bias)`; `out` is resized.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut Vec<f32>) {
        match &self.w {
            Weights::F32(w) => matmul_wt(x, m, w, self.n, self.k, out),
            Weights::Bf16(w) => matmul_wt(x, m, w, self.n, self.k, out),
        }
        if let Some(b) = &self.bias {
            out.chunks_exact_mut(self.n)
                .for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
        }
    }
}

/// A tensor's values, flattened.
pub fn to_vec(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ`; `out` is resized. `w` is f32, or bf16 bits (`u16`).
pub fn matmul_wt<T: Wt>(x: &[f32], m: usize, w: &[T], n: usize, k: usize, out: &mut Vec<f32>) {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    out.clear();
    out.resize(m * n, 0.0);
    if m == 0 || n == 0 {
        return;
    }
    let parallel = m * n * k >= PAR_MIN_MACS && rayon::current_num_threads() > 1;
    if m <= STREAM_MAX_ROWS {
        stream(x, m, w, n, k, out, parallel);
        return;
    }
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    match T::as_f32(w) {
        Some(w) => gemm_strided(x, m, w, n, k, out, n, parallelism),
        // Many rows: compute-bound, so widening W first (a panel of rows at a time, so the
        // scratch stays small) costs little next to the product.
        None => {
            let mut panel = Vec::with_capacity(GEMM_PANEL * k);
            for j0 in (0..n).step_by(GEMM_PANEL) {
                let rows = GEMM_PANEL.min(n - j0);
                panel.clear();
                panel.extend(w[j0 * k..(j0 + rows) * k].iter().map(|&v| v.to_f32()));
                gemm_strided(x, m, &panel, rows, k, &mut out[j0..], n, parallelism);
            }
        }
    }
}

/// A weight value as stored: f32, or bf16 as its bits (`u16`, the high half of an f32).
pub trait Wt: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// The slice itself when it is f32.
    fn as_f32(w: &[Self]) -> Option<&[f32]>;
    /// Sixteen values from `p`, widened to f32 lanes.
    ///
    /// # Safety
    /// AVX-512F must be enabled in the caller (this is inlined into its kernel); `p` points to
    /// 16 readable values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Eight values from `p`, widened to f32 lanes.
    ///
    /// # Safety
    /// AVX2 must be enabled in the caller (this is inlined into its kernel); `p` points to 8
    /// readable values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl Wt for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn as_f32(w: &[f32]) -> Option<&[f32]> {
        Some(w)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl Wt for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self as u32) << 16)
    }
    fn as_f32(_: &[u16]) -> Option<&[f32]> {
        None
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let h = _mm256_loadu_si256(p.cast());
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // Zero-extend to 32 bits, shift into the high half: the f32 with these bf16 bits.
        let h = _mm_loadu_si128(p.cast());
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
}

/// Rows of a bf16 W widened per `gemm` call.
const GEMM_PANEL: usize = 512;

/// `out[i * ld + j] = x[i] · w[j]` for `i < m`, `j < n`: `out` may start at a column offset of
/// a wider output (row stride `ld` ≥ n).
#[allow(clippy::too_many_arguments)]
fn gemm_strided(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
    ld: usize,
    parallelism: gemm::Parallelism,
) {
    assert!(x.len() >= m * k && w.len() >= n * k && n <= ld);
    assert!(m == 0 || out.len() >= (m - 1) * ld + n);
    // SAFETY: dst is [m, n] with row stride ld (lengths asserted above), lhs [m, k] (row stride
    // k), rhs = wᵀ, [k, n] read with row stride 1 and column stride k from w's n·k floats.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            ld as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// The weight-streaming matmul: tasks over blocks of W's rows, each computing `[rows, m]` of
/// the transposed output, then one transpose (m·n floats, small). One row (a decode) is its own
/// transpose: straight into `out`, no scratch.
fn stream<T: Wt>(
    x: &[f32],
    m: usize,
    w: &[T],
    n: usize,
    k: usize,
    out: &mut [f32],
    parallel: bool,
) {
    if m == 1 {
        stream_blocks(x, m, w, k, out, parallel);
        return;
    }
    let mut out_t = vec![0f32; n * m];
    stream_blocks(x, m, w, k, &mut out_t, parallel);
    for (j, col) in out_t.chunks_exact(m).enumerate() {
        for (i, &v) in col.iter().enumerate() {
            out[i * n + j] = v;
        }
    }
}

/// `out_t[n, m]` = W · xᵀ, in tasks of STREAM_CHUNK rows of W.
fn stream_blocks<T: Wt>(x: &[f32], m: usize, w: &[T], k: usize, out_t: &mut [f32], parallel: bool) {
    let isa = Isa::detect();
    let task = |(b, ot): (usize, &mut [f32])| {
        let j0 = b * STREAM_CHUNK;
        let rows = ot.len() / m;
        block(isa, x, m, &w[j0 * k..(j0 + rows) * k], rows, k, ot);
    };
    if parallel {
        out_t
            .par_chunks_mut(STREAM_CHUNK * m)
            .enumerate()
            .for_each(task);
    } else {
        out_t
            .chunks_mut(STREAM_CHUNK * m)
            .enumerate()
            .for_each(task);
    }
}

/// Most rows of x and of W per micro-kernel call.
const MR: usize = 6;
const NR: usize = 8;

/// The micro-kernels, fastest first; chosen once per matmul.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Isa {
    /// 16 lanes (`avx512`).
    Avx512,
    /// 8 lanes with FMA (`avx2`).
    Avx2,
    Portable,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if fma && is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if fma {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// The micro-kernel's shape for `m` rows of x: (rows of x, rows of W) per call, with at
    /// least 8 independent accumulators (two FMA pipes × 4 cycles of latency: with 4, one row
    /// waited on its FMAs) and each vector of W loaded once for as many rows of x as there
    /// are registers for. AVX2 (16 registers): 1 × 8, 2 × 4, then up to 6 × 2. AVX-512 (32):
    /// 1 × 8, 2 × 4, then up to 5 × 4 (6 × 4 spilled). Measured on the Zen 5 box (one thread,
    /// the demo target's matmuls, bf16): 16 lanes take 1 row in 0.85×, 5 rows in 0.53× the
    /// AVX2 kernel's time.
    fn tile(self, m: usize) -> (usize, usize) {
        match (self, m) {
            (_, 1) => (1, 8),
            (_, 2) => (2, 4),
            (Isa::Avx512, _) => (5, 4),
            _ => (6, 2),
        }
    }
}

/// `ot[rows, m]` = W-block `[rows, k]` · xᵀ.
fn block<T: Wt>(isa: Isa, x: &[f32], m: usize, w: &[T], rows: usize, k: usize, ot: &mut [f32]) {
    let (tr, tc) = isa.tile(m);
    let mut j = 0;
    while j < rows {
        let c = (rows - j).min(tc);
        let wj = &w[j * k..(j + c) * k];
        let mut i = 0;
        while i < m {
            let r = (m - i).min(tr);
            let xi = &x[i * k..(i + r) * k];
            let mut acc = [[0f32; NR]; MR];
            micro(isa, xi, r, wj, c, k, &mut acc);
            for (dr, row) in acc.iter().enumerate().take(r) {
                for (dc, &v) in row.iter().enumerate().take(c) {
                    ot[(j + dc) * m + i + dr] = v;
                }
            }
            i += r;
        }
        j += c;
    }
}

/// `acc[r][c] = dot(x row r, w row c)` for r < rn, c < cn, (rn, cn) within `isa.tile`.
fn micro<T: Wt>(
    isa: Isa,
    x: &[f32],
    rn: usize,
    w: &[T],
    cn: usize,
    k: usize,
    acc: &mut [[f32; NR]; MR],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: the CPU has AVX-512F, AVX2 and FMA (`Isa::detect`); the slices hold rn (cn)
        // rows of k; the shapes are `Isa::tile`'s.
        unsafe {
            match (rn, cn) {
                (1, 1) => avx512::micro::<1, 1, T>(x, w, k, acc),
                (1, 2) => avx512::micro::<1, 2, T>(x, w, k, acc),
                (1, 3) => avx512::micro::<1, 3, T>(x, w, k, acc),
                (1, 4) => avx512::micro::<1, 4, T>(x, w, k, acc),
                (1, 5) => avx512::micro::<1, 5, T>(x, w, k, acc),
                (1, 6) => avx512::micro::<1, 6, T>(x, w, k, acc),
                (1, 7) => avx512::micro::<1, 7, T>(x, w, k, acc),
                (1, 8) => avx512::micro::<1, 8, T>(x, w, k, acc),
                (2, 1) => avx512::micro::<2, 1, T>(x, w, k, acc),
                (2, 2) => avx512::micro::<2, 2, T>(x, w, k, acc),
                (2, 3) => avx512::micro::<2, 3, T>(x, w, k, acc),
                (2, 4) => avx512::micro::<2, 4, T>(x, w, k, acc),
                (3, 1) => avx512::micro::<3, 1, T>(x, w, k, acc),
                (3, 2) => avx512::micro::<3, 2, T>(x, w, k, acc),
                (3, 3) => avx512::micro::<3, 3, T>(x, w, k, acc),
                (3, 4) => avx512::micro::<3, 4, T>(x, w, k, acc),
                (4, 1) => avx512::micro::<4, 1, T>(x, w, k, acc),
                (4, 2) => avx512::micro::<4, 2, T>(x, w, k, acc),
                (4, 3) => avx512::micro::<4, 3, T>(x, w, k, acc),
                (4, 4) => avx512::micro::<4, 4, T>(x, w, k, acc),
                (5, 1) => avx512::micro::<5, 1, T>(x, w, k, acc),
                (5, 2) => avx512::micro::<5, 2, T>(x, w, k, acc),
                (5, 3) => avx512::micro::<5, 3, T>(x, w, k, acc),
                (5, 4) => avx512::micro::<5, 4, T>(x, w, k, acc),
                _ => unreachable!("micro-kernel shape {rn}x{cn}"),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: the CPU has AVX2 and FMA (checked just above); slices hold rn (cn) rows of k.
        unsafe {
            match (rn, cn) {
                (1, 1) => avx2::micro::<1, 1, T>(x, w, k, acc),
                (1, 2) => avx2::micro::<1, 2, T>(x, w, k, acc),
                (1, 3) => avx2::micro::<1, 3, T>(x, w, k, acc),
                (1, 4) => avx2::micro::<1, 4, T>(x, w, k, acc),
                (1, 5) => avx2::micro::<1, 5, T>(x, w, k, acc),
                (1, 6) => avx2::micro::<1, 6, T>(x, w, k, acc),
                (1, 7) => avx2::micro::<1, 7, T>(x, w, k, acc),
                (1, 8) => avx2::micro::<1, 8, T>(x, w, k, acc),
                (2, 1) => avx2::micro::<2, 1, T>(x, w, k, acc),
                (2, 2) => avx2::micro::<2, 2, T>(x, w, k, acc),
                (2, 3) => avx2::micro::<2, 3, T>(x, w, k, acc),
                (2, 4) => avx2::micro::<2, 4, T>(x, w, k, acc),
                (3, 1) => avx2::micro::<3, 1, T>(x, w, k, acc),
                (3, 2) => avx2::micro::<3, 2, T>(x, w, k, acc),
                (4, 1) => avx2::micro::<4, 1, T>(x, w, k, acc),
                (4, 2) => avx2::micro::<4, 2, T>(x, w, k, acc),
                (5, 1) => avx2::micro::<5, 1, T>(x, w, k, acc),
                (5, 2) => avx2::micro::<5, 2, T>(x, w, k, acc),
                (6, 1) => avx2::micro::<6, 1, T>(x, w, k, acc),
                (6, 2) => avx2::micro::<6, 2, T>(x, w, k, acc),
                _ => unreachable!("micro-kernel shape {rn}x{cn}"),
            }
        }
        return;
    }
    for (r, row) in acc.iter_mut().enumerate().take(rn) {
        for (c, a) in row.iter_mut().enumerate().take(cn) {
            *a = dot_wt(&x[r * k..(r + 1) * k], &w[c * k..(c + 1) * k]);
        }
    }
}

/// `dot` with W's row widened to f32 as it is read (the same operations in the same order; no
/// widened copy of the row).
#[inline]
fn dot_wt<T: Wt>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y.to_f32())
        .sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j].to_f32();
        }
    }
    reduce8(&acc) + tail
}

/// The portable dot product: eight lanes over k (the loop vectorises, no serial add chain),
/// reduced pairwise. Also attention's q·k and the head norms' sums of squares.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_wt(a, b)
}

/// One fixed order of summing eight lanes.
#[inline(always)]
fn reduce8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{reduce8, Wt, MR, NR};

    /// R rows of x against C rows of W, each output one 8-lane FMA accumulator over k.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `x` holds R rows of `k`, `w` C rows of `k`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn micro<const R: usize, const C: usize, T: Wt>(
        x: &[f32],
        w: &[T],
        k: usize,
        out: &mut [[f32; NR]; MR],
    ) {
        debug_assert!(x.len() >= R * k && w.len() >= C * k);
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let k8 = k / 8 * 8;
        let mut p = 0;
        // W streams from memory once: fetch the next micro-panel's lines (C rows on) while
        // this one computes (every 16 values: each line of 16 f32 once, a bf16 line twice;
        // harmless past the end: prefetches do not fault).
        let ahead = wp.wrapping_add(C * k);
        while p < k8 {
            if p % 16 == 0 {
                for c in 0..C {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(c * k + p).cast());
                }
            }
            let mut wv = [_mm256_setzero_ps(); C];
            for (c, v) in wv.iter_mut().enumerate() {
                *v = T::load8(wp.add(c * k + p));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(xp.add(r * k + p));
                for c in 0..C {
                    a[c] = _mm256_fmadd_ps(xv, wv[c], a[c]);
                }
            }
            p += 8;
        }
        for r in 0..R {
            for c in 0..C {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][c]);
                let mut s = reduce8(&lanes);
                for q in k8..k {
                    s += x[r * k + q] * w[c * k + q].to_f32();
                }
                out[r][c] = s;
            }
        }
    }
}

/// Runs `f` over `rows` rows of `width` in `data` (with the row index), in parallel when there
/// are enough rows.
fn rows_mut(data: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = data.len() / width.max(1);
    if rows >= 2 * ROWS_PER_TASK && rayon::current_num_threads() > 1 {
        data.par_chunks_mut(width * ROWS_PER_TASK)
            .enumerate()
            .for_each(|(b, chunk)| {
                for (i, row) in chunk.chunks_exact_mut(width).enumerate() {
                    f(b * ROWS_PER_TASK + i, row)
                }
            });
    } else {
        data.chunks_exact_mut(width)
            .enumerate()
            .for_each(|(i, row)| f(i, row));
    }
}

/// `out = rmsnorm(x) * weight`, row by row (`x` is `[rows, weight.len()]`); `out` is resized.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    let h = weight.len();
    out.clear();
    out.resize(x.len(), 0.0);
    rows_mut(out, h, |i, o| {
        let xi = &x[i * h..(i + 1) * h];
        let ss: f32 = xi.iter().map(|v| v * v).sum();
        let inv = (ss / h as f32 + eps).sqrt().recip();
        for ((o, &v), &w) in o.iter_mut().zip(xi).zip(weight) {
            *o = v * inv * w;
        }
    });
}

/// `out = silu(gate) * up` from the fused `[rows, gate | up]`; `out` is `[rows, intermediate]`.
pub fn swiglu(gate_up: &[f32], intermediate: usize, out: &mut Vec<f32>) {
    out.clear();
    out.resize(gate_up.len() / 2, 0.0);
    rows_mut(out, intermediate, |i, o| {
        let (g, u) =
            gate_up[i * 2 * intermediate..(i + 1) * 2 * intermediate].split_at(intermediate);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    });
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}

#[cfg(test)]
pub(crate) mod tests;
