//! The bulk-copy gemv (kernels/gemv_bulk.cu): decode rows of a linear layer with bf16 weights
//! streamed through a shared-memory ring by `cp.async.bulk`, one CTA an SM. `kernels::gemv`
//! launches it where `Gpu::gemv_bulk` is on and `gemv_bulk_grid` takes the shape; the decode
//! forward's `bulk_fusion` path launches it through `gemv_bulk` with a fused input or output
//! (`BulkInput`, `BulkOutput`).

use super::{GemvParams, Gpu, GEMV_MAX_M};
pub use crate::executor::cuda::compile::{
    gemv_bulk_kernel, gemv_bulk_kernels, GEMV_BULK_ACC_FLOATS, GEMV_BULK_SHORT_STAGES,
    GEMV_BULK_SMEM, GEMV_BULK_STAGES, GEMV_BULK_STAGE_BYTES, GEMV_BULK_THREADS, GEMV_BULK_X_BYTES,
};

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvBulkParams {
    /// 0 when `norm_in` or `gate_up` makes x.
    pub x: u64,
    pub w: u64,
    /// 0 when `y32` is set.
    pub y: u64,
    /// 0 for a bf16 output.
    pub y32: u64,
    pub norm_in: u64,
    pub norm_w: u64,
    pub gate_up: u64,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub accumulate: i32,
    /// 1: stages add their partial sums in stage order (`Gpu::gemv_bulk_ordered`).
    pub ordered: i32,
    pub eps: f32,
}

/// What a bulk gemv takes as its input rows x [m, k] (bf16 in the kernel's shared memory).
#[derive(Debug, Clone, Copy)]
pub enum BulkInput {
    /// bf16 x [m, k].
    X(u64),
    /// rmsnorm(residual) * weight over the fp32 residual stream [m, k] (add_rmsnorm's
    /// arithmetic, without the add: the residual is already whole).
    Norm {
        residual: u64,
        weight: u64,
        eps: f32,
    },
    /// silu(gate) * up over the fp32 gate|up projection [m, 2k] (silu_mul's arithmetic).
    GateUp(u64),
}

/// Where a bulk gemv writes its rows y [m, n].
#[derive(Debug, Clone, Copy)]
pub enum BulkOutput {
    Bf16(u64),
    F32(u64),
    /// y += x · wᵀ into fp32 rows: the residual add of the o and down projections.
    AddF32(u64),
}

/// One bulk gemv: `input` times bf16 weights `w` [n, k] into `output`, for m <= 4 rows.
#[derive(Debug, Clone, Copy)]
pub struct BulkGemv {
    pub input: BulkInput,
    pub w: u64,
    pub output: BulkOutput,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl BulkGemv {
    /// The kernel's parameter struct.
    pub fn params(&self) -> GemvBulkParams {
        let (mut x, mut norm_in, mut norm_w, mut gate_up, mut eps) = (0, 0, 0, 0, 0.0);
        match self.input {
            BulkInput::X(p) => x = p,
            BulkInput::Norm {
                residual,
                weight,
                eps: e,
            } => (norm_in, norm_w, eps) = (residual, weight, e),
            BulkInput::GateUp(p) => gate_up = p,
        }
        let (y, y32, accumulate) = match self.output {
            BulkOutput::Bf16(p) => (p, 0, 0),
            BulkOutput::F32(p) => (0, p, 0),
            BulkOutput::AddF32(p) => (0, p, 1),
        };
        GemvBulkParams {
            x,
            w: self.w,
            y,
            y32,
            norm_in,
            norm_w,
            gate_up,
            m: self.m as i32,
            n: self.n as i32,
            k: self.k as i32,
            accumulate,
            ordered: 0,
            eps,
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

/// Launches `g` on the bulk kernel; an error where `gemv_bulk_grid` refuses its shape (the
/// fused inputs and outputs have no other kernel: the forward checks a layer's four shapes
/// before it takes the fused path).
///
/// # Safety
/// Every pointer in `g` addresses a live device buffer of the shape given in gemv_bulk.cu.
pub unsafe fn gemv_bulk(gpu: &Gpu, g: &BulkGemv) -> anyhow::Result<()> {
    let Some(ctas) = gemv_bulk_grid(gpu, g.m, g.n, g.k) else {
        anyhow::bail!(
            "the bulk gemv does not take m {} n {} k {} here",
            g.m,
            g.n,
            g.k
        );
    };
    launch_bulk(gpu, ctas, g)
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
    let output = match p.y32 {
        0 => BulkOutput::Bf16(p.y),
        y32 => BulkOutput::F32(y32),
    };
    let g = BulkGemv {
        input: BulkInput::X(p.x),
        w: p.w,
        output,
        m,
        n,
        k,
    };
    launch_bulk(gpu, ctas, &g)?;
    Ok(true)
}

/// Dynamic shared memory of a bulk gemv launch over `m` rows of length `k` with `gpu`'s ring:
/// the ring and, with `Gpu::gemv_bulk_tight`, x and no more (so that CTAs of the neighbouring
/// kernels fit beside it on an SM), else room for the largest x.
pub fn gemv_bulk_smem(gpu: &Gpu, m: usize, k: usize) -> u32 {
    let x = match gpu.gemv_bulk_tight {
        true => (2 * m * k).next_multiple_of(16),
        false => GEMV_BULK_X_BYTES,
    };
    (gpu.gemv_bulk_stages * GEMV_BULK_STAGE_BYTES + x) as u32
}

/// # Safety
/// As `gemv_bulk`, with `ctas` from `gemv_bulk_grid`.
unsafe fn launch_bulk(gpu: &Gpu, ctas: u32, g: &BulkGemv) -> anyhow::Result<()> {
    let shape = (
        (ctas, 1, 1),
        (GEMV_BULK_THREADS, 1, 1),
        gemv_bulk_smem(gpu, g.m, g.k),
    );
    let p = GemvBulkParams {
        ordered: gpu.gemv_bulk_ordered.into(),
        ..g.params()
    };
    gpu.launch_pdl_sized(&gemv_bulk_kernel(g.m, gpu.gemv_bulk_stages), shape, &p)
}
