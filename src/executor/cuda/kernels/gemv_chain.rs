//! The gemv chain (kernels/gemv_chain.cu): several skinny GEMMs of up to four rows in one
//! cooperative launch, a grid barrier between them, each op's x staged by a rule that folds in
//! the kernel that would have run before it (add + RMSNorm, SiLU · up). `gpu-bench
//! stream-floor` times it against per-matrix launches; the executor does not use it (slower:
//! BENCHMARKS.md, session 34).

use super::{Gpu, GEMV_BULK_ACC_FLOATS, GEMV_BULK_THREADS, GEMV_BULK_X_BYTES, GEMV_MAX_M};
pub use crate::executor::cuda::compile::{chain_kernel_name, chain_smem};

/// How an op's x is staged (`CHAIN_X_*`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainX {
    /// x = `src` (bf16 [m, k]).
    Plain = 0,
    /// v = `src` (fp32 residual [m, k]) + `delta`; x = RMSNorm(v) · `gamma`; v to `res_out`.
    Norm = 1,
    /// x = silu(gate) · up from `src` (bf16 [m, 2k]).
    Silu = 2,
}

/// gemv_chain.cu's `ChainOp`: y [m, n] = x [m, k] · w [n, k]ᵀ.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ChainOp {
    pub w: u64,
    pub src: u64,
    /// `Norm`: bf16 [m, k] added to the residual, or 0.
    pub delta: u64,
    /// `Norm`: [k].
    pub gamma: u64,
    /// `Norm`: fp32 [m, k], never `src`.
    pub res_out: u64,
    /// bf16 [m, n], or 0 when `y32` is set.
    pub y: u64,
    /// fp32 [m, n], or 0.
    pub y32: u64,
    pub n: i32,
    pub k: i32,
    pub x_mode: ChainX,
    pub eps: f32,
}

impl ChainOp {
    /// y = src · wᵀ.
    pub fn plain(w: u64, src: u64, y: u64, n: usize, k: usize) -> ChainOp {
        ChainOp {
            w,
            src,
            delta: 0,
            gamma: 0,
            res_out: 0,
            y,
            y32: 0,
            n: n as i32,
            k: k as i32,
            x_mode: ChainX::Plain,
            eps: 0.0,
        }
    }
}

/// gemv_chain.cu's `GemvChainParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvChainParams {
    /// Device [count] of `ChainOp`.
    pub ops: u64,
    pub count: i32,
    pub m: i32,
    /// Device [2] u32 (arrivals, generation), zero when allocated.
    pub barrier: u64,
}

/// The ring's stage size for a chain of `shapes` (n, k) at `m` rows, or None where the chain
/// does not take them: more than `GEMV_MAX_M` rows, x past `GEMV_BULK_X_BYTES`, a CTA's rows
/// past the accumulator at one CTA an SM, k not whole 16-byte chunks, or rows shorter than the
/// small build's stage. 4096-byte stages where every row holds one (the shipped ring's), else
/// 512.
pub fn chain_stage_bytes(gpu: &Gpu, m: usize, shapes: &[(usize, usize)]) -> Option<usize> {
    if !gpu.gemv_bulk || m == 0 || m > GEMV_MAX_M || shapes.is_empty() {
        return None;
    }
    let sms = gpu.num_sms as usize;
    let fits = |&(n, k): &(usize, usize)| {
        k % 8 == 0 && m * 2 * k <= GEMV_BULK_X_BYTES && n.div_ceil(sms) * m <= GEMV_BULK_ACC_FLOATS
    };
    if !shapes.iter().all(fits) {
        return None;
    }
    let shortest = shapes.iter().map(|&(_, k)| 2 * k).min()?;
    [4096, 512].into_iter().find(|&sb| shortest >= sb)
}

/// Launches the chain (`Gpu::load_gemv_chain(stage_bytes)` first) over `p.count` ops.
///
/// # Safety
/// Every op's pointers hold what `ChainOp` says for `p.m` rows; `p.barrier` is a zeroed pair of
/// u32 no other stream's launch uses; the stage size took the shapes (`chain_stage_bytes`).
pub unsafe fn gemv_chain(gpu: &Gpu, p: &GemvChainParams, stage_bytes: usize) -> anyhow::Result<()> {
    let name = chain_kernel_name(p.m as usize, stage_bytes);
    let shape = (
        (gpu.num_sms, 1, 1),
        (GEMV_BULK_THREADS, 1, 1),
        chain_smem(stage_bytes) as u32,
    );
    gpu.launch_fn_coop(gpu.function(&name), &name, shape, p)?;
    gpu.traced(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_records_match_the_kernel_structs() {
        assert_eq!(std::mem::size_of::<ChainOp>(), 7 * 8 + 4 * 4);
        assert_eq!(std::mem::size_of::<GemvChainParams>(), 8 + 2 * 4 + 8);
    }
}
