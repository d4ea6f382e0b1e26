//! The bulk-copy gemv (kernels/gemv_bulk.cu): decode rows of a linear layer with bf16 weights
//! streamed through a shared-memory ring by `cp.async.bulk`, one CTA an SM. `kernels::gemv`
//! launches it where `Gpu::gemv_bulk` is on and `gemv_bulk_grid` takes the shape.

use super::{GemvParams, Gpu, GEMV_MAX_M};
pub use crate::executor::cuda::compile::{
    gemv_bulk_deep_kernels, gemv_bulk_kernels, GEMV_BULK_ACC_FLOATS, GEMV_BULK_DEEP_MAX_M,
    GEMV_BULK_DEEP_SMEM, GEMV_BULK_DEEP_STAGES, GEMV_BULK_SMEM, GEMV_BULK_STAGES,
    GEMV_BULK_STAGE_BYTES, GEMV_BULK_THREADS, GEMV_BULK_X_BYTES,
};
use crate::executor::cuda::options::GemvSmem;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvBulkParams {
    pub x: u64,
    pub w: u64,
    /// 0 when `y32` is set.
    pub y: u64,
    /// 0 for a bf16 output.
    pub y32: u64,
    pub m: i32,
    pub n: i32,
    pub k: i32,
}

/// The bulk kernel's parameters for a `gemv` launch (bf16 weights: no scale, no split).
impl From<&GemvParams> for GemvBulkParams {
    fn from(p: &GemvParams) -> Self {
        GemvBulkParams {
            x: p.x,
            w: p.w,
            y: p.y,
            y32: p.y32,
            m: p.m,
            n: p.n,
            k: p.k,
        }
    }
}

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
    gemv_bulk_with(gpu, p, gpu.gemv_smem)
}

/// `try_gemv_bulk` with the launch's shared memory as `mode` says rather than `gpu.gemv_smem`
/// (gpu-bench stream-floor compares them).
///
/// # Safety
/// As `kernels::gemv`.
pub unsafe fn gemv_bulk_with(gpu: &Gpu, p: &GemvParams, mode: GemvSmem) -> anyhow::Result<bool> {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let Some(ctas) = gemv_bulk_grid(gpu, m, n, k) else {
        return Ok(false);
    };
    let name = format!("gemv_bulk_m{m}");
    let (grid, block) = ((ctas, 1, 1), (GEMV_BULK_THREADS, 1, 1));
    let params = GemvBulkParams::from(p);
    let rows = n.div_ceil(ctas as usize);
    match mode {
        GemvSmem::Roomy => gpu.launch_pdl(&name, grid, block, &params)?,
        GemvSmem::Deep if gemv_bulk_deep_fits(gpu, m, rows, k) => {
            let smem = gemv_bulk_smem(GEMV_BULK_DEEP_STAGES, m, rows, k);
            let name = format!("gemv_bulk_deep_m{m}");
            gpu.launch_pdl_smem(&name, grid, block, smem, &params)?
        }
        GemvSmem::Tight | GemvSmem::Deep => {
            let smem = gemv_bulk_smem(GEMV_BULK_STAGES, m, rows, k);
            gpu.launch_pdl_smem(&name, grid, block, smem, &params)?
        }
    }
    Ok(true)
}

/// Whether a bulk launch of `m` rows over k, a CTA owning `rows` rows, takes the deep ring:
/// its kernels are loaded and x and the accumulator fit beside the ring.
pub fn gemv_bulk_deep_fits(gpu: &Gpu, m: usize, rows: usize, k: usize) -> bool {
    gpu.gemv_deep
        && m <= GEMV_BULK_DEEP_MAX_M
        && gemv_bulk_smem(GEMV_BULK_DEEP_STAGES, m, rows, k) as usize <= GEMV_BULK_DEEP_SMEM
}

/// Dynamic shared memory of a bulk launch that asks for only what it uses (`GemvSmem::Tight`
/// and `Deep`): a ring of `stages`, x [m, k] (rounded up to 16 bytes), then the accumulator of
/// a CTA's `rows` rows [rows][m] fp32.
pub fn gemv_bulk_smem(stages: usize, m: usize, rows: usize, k: usize) -> u32 {
    (stages * GEMV_BULK_STAGE_BYTES + (2 * m * k).next_multiple_of(16) + 4 * rows * m) as u32
}
