//! The bulk-copy gemv (kernels/gemv_bulk.cu): decode rows of a linear layer with bf16 weights
//! streamed through a shared-memory ring by `cp.async.bulk`, one CTA an SM. `kernels::gemv`
//! launches it where `Gpu::gemv_bulk` is on and `gemv_bulk_grid` takes the shape.

use super::{GemvParams, Gpu, GEMV_MAX_M};
pub use crate::executor::cuda::compile::{
    gemv_bulk_kernels, GEMV_BULK_ACC_FLOATS, GEMV_BULK_SMEM, GEMV_BULK_STAGES,
    GEMV_BULK_STAGE_BYTES, GEMV_BULK_THREADS, GEMV_BULK_X_BYTES,
};

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GemvBulkParams {
    /// bf16 `[m, k]`, read when `src` is `BULK_SRC_X`.
    pub x: u64,
    pub w: u64,
    /// 0 when `y32` is set.
    pub y: u64,
    /// 0 for a bf16 output.
    pub y32: u64,
    /// `BULK_SRC_NORM`: the fp32 residual `[m, k]`; `BULK_SRC_SILU`: fp32 gate|up `[m, 2k]`.
    pub src32: u64,
    /// `BULK_SRC_NORM`'s weight, bf16 `[k]`.
    pub norm_w: u64,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    /// What x is built from: `BULK_SRC_X`, `BULK_SRC_NORM` or `BULK_SRC_SILU`.
    pub src: i32,
    /// 1: `y32 += x · wᵀ` (the residual), 0: `y32 = x · wᵀ`.
    pub accumulate: i32,
    pub eps: f32,
}

/// x is read as given (`GemvBulkParams::x`).
pub const BULK_SRC_X: i32 = 0;
/// x is the RMSNorm of the fp32 residual `src32` times `norm_w` (add_rmsnorm without a delta).
pub const BULK_SRC_NORM: i32 = 1;
/// x is SiLU(gate) × up from the fp32 gate|up rows `src32` (silu_mul).
pub const BULK_SRC_SILU: i32 = 2;

/// CTAs of a bulk gemv over bf16 weights [n, k] for `m` decode rows, or None where the kernel
/// does not apply: off (`Gpu::gemv_bulk`, sm_90+ only), more than `GEMV_MAX_M` rows, rows
/// shorter than a stage (one would hold more than one row end; short rows are small models',
/// which the split kernel serves) or not whole 16-byte chunks, x past `GEMV_BULK_X_BYTES`, or
/// a slab past i32 offsets. One CTA an SM, or more where the SM count would give a CTA more
/// rows than its accumulator holds; never more CTAs than rows.
pub fn gemv_bulk_grid(gpu: &Gpu, m: usize, n: usize, k: usize) -> Option<u32> {
    let row_bytes = 2 * k;
    if !gpu.gemv_bulk || m == 0 || m > GEMV_MAX_M || n == 0 || m * row_bytes > GEMV_BULK_X_BYTES {
        return None;
    }
    if row_bytes < GEMV_BULK_STAGE_BYTES || row_bytes % 16 != 0 {
        return None;
    }
    let cap = GEMV_BULK_ACC_FLOATS / m;
    if cap * row_bytes > i32::MAX as usize {
        return None;
    }
    let ctas = (gpu.num_sms as usize).max(n.div_ceil(cap)).min(n);
    u32::try_from(ctas).ok()
}

/// `gemv` on the bulk kernel when `gemv_bulk_grid` takes the shape; Ok(false) (nothing
/// launched) otherwise.
///
/// # Safety
/// As `kernels::gemv`.
pub(super) unsafe fn try_gemv_bulk(gpu: &Gpu, p: &GemvParams) -> anyhow::Result<bool> {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let Some(ctas) = gemv_bulk_grid(gpu, m, n, k) else {
        return Ok(false);
    };
    let q = GemvBulkParams {
        x: p.x,
        w: p.w,
        y: p.y,
        y32: p.y32,
        m: p.m,
        n: p.n,
        k: p.k,
        ..Default::default()
    };
    launch(gpu, &q, ctas)?;
    Ok(true)
}

/// The bulk gemv with x built in the kernel (`p.src`) and, with `p.accumulate`, its output
/// added into `p.y32`: the fused decode layer (`CudaBackendOptions::fuse_bulk`). An error where
/// `gemv_bulk_grid` does not take the shape (the forward checks `fuse_bulk_takes` first).
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in gemv_bulk.cu.
pub unsafe fn gemv_bulk(gpu: &Gpu, p: &GemvBulkParams) -> anyhow::Result<()> {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let ctas = gemv_bulk_grid(gpu, m, n, k)
        .ok_or_else(|| anyhow::anyhow!("gemv_bulk does not take m {m} n {n} k {k}"))?;
    anyhow::ensure!(
        (BULK_SRC_X..=BULK_SRC_SILU).contains(&p.src)
            && (p.src == BULK_SRC_X || p.src32 != 0)
            && (p.src != BULK_SRC_NORM || p.norm_w != 0)
            && (p.accumulate == 0 || p.y32 != 0),
        "gemv_bulk: src {} needs its input, accumulate an fp32 output",
        p.src
    );
    launch(gpu, p, ctas)
}

/// Whether `gemv_bulk` takes every projection of a decode layer at `m` rows: qkv `[qkv_dim,
/// d]`, o `[d, q_dim]`, gate|up `[2 inter, d]`, down `[d, inter]`.
pub fn fuse_bulk_takes(
    gpu: &Gpu,
    m: usize,
    (d, q_dim, qkv_dim, inter): (usize, usize, usize, usize),
) -> bool {
    [(qkv_dim, d), (d, q_dim), (2 * inter, d), (d, inter)]
        .iter()
        .all(|&(n, k)| gemv_bulk_grid(gpu, m, n, k).is_some() && k % 8 == 0)
}

/// # Safety
/// As `gemv_bulk`.
unsafe fn launch(gpu: &Gpu, p: &GemvBulkParams, ctas: u32) -> anyhow::Result<()> {
    gpu.launch_pdl(
        &format!("gemv_bulk_m{}", p.m),
        (ctas, 1, 1),
        (GEMV_BULK_THREADS, 1, 1),
        p,
    )
}
