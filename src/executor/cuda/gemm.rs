//! Linear layers: bf16 weights through the `gemv` kernel (decode rows) or cuBLAS, e4m3 weights
//! (`--quantization fp8`) through `gemv_fp8` or cuBLASLt's fp8 GEMM (`fp8_gemm`); fp32
//! accumulation throughout.

use std::ffi::c_void;

use anyhow::Context;
use cudarc::cublas::sys::{
    self, cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
};

use super::device::Gpu;
use super::fp8_gemm::Fp8Gemm;
use super::kernels::{self, GemvParams};

/// A linear layer's weight as `linear` reads it: `[n, k]` bf16, or e4m3 with its f32 scale
/// (`scale` non-zero: the address of `[scale, 1 / scale]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weight {
    pub ptr: u64,
    /// 0: bf16.
    pub scale: u64,
}

impl Weight {
    pub fn bf16(ptr: u64) -> Self {
        Weight { ptr, scale: 0 }
    }
}

/// y[m, n] = x[m, k] · w[n, k]ᵀ, all row-major (w as stored in HF checkpoints: [out, in]).
/// `y` is bf16, or fp32 when `y_f32` (logits, and outputs an fp32 epilogue reads). Up to `gpu.gemv_max_m` rows (decode) go to the
/// `gemv` kernel (`gemv_fp8` for e4m3 weights), which streams w at close to memory bandwidth;
/// the rest to cuBLAS (for e4m3 weights cuBLASLt's fp8 GEMM through `fp8`, which they need).
///
/// # Safety
/// The pointers address buffers of those shapes on `gpu`.
#[allow(clippy::too_many_arguments)] // the BLAS call's own shape: pointers, m, n, k, out type
pub unsafe fn linear(
    gpu: &Gpu,
    fp8: Option<&Fp8Gemm>,
    x: u64,
    w: Weight,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
    y_f32: bool,
) -> anyhow::Result<()> {
    if m == 0 {
        return Ok(());
    }
    if w.scale != 0 {
        return linear_fp8(gpu, fp8, x, w, y, (m, n, k), y_f32);
    }
    let w = w.ptr;
    if m <= gpu.gemv_max_m && k % 8 == 0 {
        let (y16, y32) = if y_f32 { (0, y) } else { (y, 0) };
        let p = GemvParams {
            x,
            w,
            y: y16,
            y32,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            split: kernels::gemv_split(gpu, k),
            w_scale: 0,
        };
        return kernels::gemv(gpu, &p);
    }
    let y_type = if y_f32 {
        cudaDataType::CUDA_R_32F
    } else {
        cudaDataType::CUDA_R_16BF
    };
    cublas_linear(gpu, x, w, y, (m, n, k), y_type, 0.0)?;
    gpu.traced(format_args!("gemm {m}x{n}x{k}"))
}

/// y[m, n] += x[m, k] · w[n, k]ᵀ into fp32 `y` (the residual stream), on cuBLAS at any m: the
/// o and down projections of prefill and large decode steps add into the residual in their
/// epilogue instead of writing a bf16 delta that the next norm reads back
/// (`CudaBackendOptions::residual_gemm`). bf16 weights only.
///
/// # Safety
/// As `linear`; `y` is fp32 `[m, n]`.
pub unsafe fn linear_add(
    gpu: &Gpu,
    x: u64,
    w: Weight,
    y: u64,
    (m, n, k): (usize, usize, usize),
) -> anyhow::Result<()> {
    anyhow::ensure!(w.scale == 0, "linear_add takes bf16 weights");
    if m == 0 {
        return Ok(());
    }
    cublas_linear(gpu, x, w.ptr, y, (m, n, k), cudaDataType::CUDA_R_32F, 1.0)?;
    gpu.traced(format_args!("gemm+= {m}x{n}x{k}"))
}

/// cuBLAS y = x · wᵀ + beta · y (bf16 x and w, fp32 accumulation, y of `y_type`).
///
/// # Safety
/// As `linear`.
unsafe fn cublas_linear(
    gpu: &Gpu,
    x: u64,
    w: u64,
    y: u64,
    (m, n, k): (usize, usize, usize),
    y_type: cudaDataType,
    beta: f32,
) -> anyhow::Result<()> {
    // Column-major view: yᵀ[n, m] = w[k, n]ᵀ · xᵀ[k, m].
    let alpha = 1.0f32;
    sys::cublasGemmEx(
        *gpu.blas.handle(),
        cublasOperation_t::CUBLAS_OP_T,
        cublasOperation_t::CUBLAS_OP_N,
        n as i32,
        m as i32,
        k as i32,
        &alpha as *const f32 as *const c_void,
        w as *const c_void,
        cudaDataType::CUDA_R_16BF,
        k as i32,
        x as *const c_void,
        cudaDataType::CUDA_R_16BF,
        k as i32,
        &beta as *const f32 as *const c_void,
        y as *mut c_void,
        y_type,
        n as i32,
        cublasComputeType_t::CUBLAS_COMPUTE_32F,
        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
    )
    .result()
    .with_context(|| format!("cublasGemmEx m={m} n={n} k={k}"))
}

/// `linear` over e4m3 weights: `gemv_fp8` for decode rows, else the fp8 GEMM.
///
/// # Safety
/// As `linear`.
unsafe fn linear_fp8(
    gpu: &Gpu,
    fp8: Option<&Fp8Gemm>,
    x: u64,
    w: Weight,
    y: u64,
    (m, n, k): (usize, usize, usize),
    y_f32: bool,
) -> anyhow::Result<()> {
    if m <= gpu.gemv_max_m && k % 16 == 0 {
        let (y16, y32) = if y_f32 { (0, y) } else { (y, 0) };
        let p = GemvParams {
            x,
            w: w.ptr,
            y: y16,
            y32,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            // Split by the row's bytes: an e4m3 row is half a bf16 row of the same k.
            split: kernels::gemv_split(gpu, k / 2),
            w_scale: w.scale,
        };
        return kernels::gemv_fp8(gpu, &p);
    }
    let fp8 = fp8.context("e4m3 weights without the fp8 GEMM path (fp8_gemm::Fp8Gemm)")?;
    fp8.linear(gpu, x, (w.ptr, w.scale), y, (m, n, k), y_f32)
}

/// One operand of `gemm_strided_batched`: device address, element type, leading dimension and
/// the stride (in elements) from one batch entry to the next.
#[derive(Debug, Clone, Copy)]
pub struct Operand {
    pub ptr: u64,
    pub f32: bool,
    pub ld: usize,
    pub stride: usize,
}

impl Operand {
    /// A bf16 operand.
    pub fn bf16(ptr: u64, ld: usize, stride: usize) -> Self {
        Operand {
            ptr,
            f32: false,
            ld,
            stride,
        }
    }

    /// An fp32 operand.
    pub fn f32(ptr: u64, ld: usize, stride: usize) -> Self {
        Operand {
            ptr,
            f32: true,
            ld,
            stride,
        }
    }
}

/// `batch` independent products C_i = op(A_i) · op(B_i) in cuBLAS's column-major convention
/// (C_i is m × n, op(A_i) m × k, op(B_i) k × n), fp32 accumulation; A and B are bf16, C bf16 or
/// fp32. `trans_a` / `trans_b` select op = transpose.
///
/// # Safety
/// Every operand addresses a buffer that holds its `batch` matrices at those strides on `gpu`.
#[allow(clippy::too_many_arguments)] // the BLAS call's own shape
pub unsafe fn gemm_strided_batched(
    gpu: &Gpu,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    c: Operand,
    batch: usize,
) -> anyhow::Result<()> {
    if m == 0 || n == 0 || batch == 0 {
        return Ok(());
    }
    let op = |t: bool| match t {
        true => cublasOperation_t::CUBLAS_OP_T,
        false => cublasOperation_t::CUBLAS_OP_N,
    };
    let ty = |o: &Operand| match o.f32 {
        true => cudaDataType::CUDA_R_32F,
        false => cudaDataType::CUDA_R_16BF,
    };
    let (alpha, beta) = (1.0f32, 0.0f32);
    sys::cublasGemmStridedBatchedEx(
        *gpu.blas.handle(),
        op(trans_a),
        op(trans_b),
        m as i32,
        n as i32,
        k as i32,
        &alpha as *const f32 as *const c_void,
        a.ptr as *const c_void,
        ty(&a),
        a.ld as i32,
        a.stride as i64,
        b.ptr as *const c_void,
        ty(&b),
        b.ld as i32,
        b.stride as i64,
        &beta as *const f32 as *const c_void,
        c.ptr as *mut c_void,
        ty(&c),
        c.ld as i32,
        c.stride as i64,
        batch as i32,
        cublasComputeType_t::CUBLAS_COMPUTE_32F,
        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
    )
    .result()
    .with_context(|| format!("cublasGemmStridedBatchedEx m={m} n={n} k={k} batch={batch}"))?;
    gpu.traced(format_args!("batched gemm {m}x{n}x{k}"))
}
