//! Linear layers through cuBLAS: bf16 operands, fp32 accumulation.

use std::ffi::c_void;

use anyhow::Context;
use cudarc::cublas::sys::{
    self, cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
};

use super::device::Gpu;
use super::kernels::{self, GemvParams};

/// y[m, n] = x[m, k] · w[n, k]ᵀ, all row-major (w as stored in HF checkpoints: [out, in]).
/// `y` is bf16, or fp32 when `y_f32` (logits, and outputs an fp32 epilogue reads). Up to `gpu.gemv_max_m` rows (decode) go to the
/// `gemv` kernel, which streams w at close to memory bandwidth; the rest to cuBLAS.
///
/// # Safety
/// The pointers address buffers of those shapes on `gpu`.
#[allow(clippy::too_many_arguments)] // the BLAS call's own shape: pointers, m, n, k, out type
pub unsafe fn linear(
    gpu: &Gpu,
    x: u64,
    w: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
    y_f32: bool,
) -> anyhow::Result<()> {
    if m == 0 {
        return Ok(());
    }
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
        };
        return kernels::gemv(gpu, &p);
    }
    // Column-major view: yᵀ[n, m] = w[k, n]ᵀ · xᵀ[k, m].
    let (alpha, beta) = (1.0f32, 0.0f32);
    let y_type = if y_f32 {
        cudaDataType::CUDA_R_32F
    } else {
        cudaDataType::CUDA_R_16BF
    };
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
