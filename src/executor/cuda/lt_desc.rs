//! cuBLASLt's descriptors of one GEMM y[m, n] = x[m, k] · w[n, k]ᵀ (all row-major, w as HF
//! stores it), in cuBLASLt's column-major terms: A is w seen as [k, n] and transposed, B is x as
//! [k, m], D (and C) is y as [n, m]; fp32 accumulation and scale. The fp8 GEMM path keeps one a
//! shape with its algorithm; gpu-bench's `gemm-algos` times the heuristic's candidates on them.

use std::ffi::c_void;

use anyhow::Context;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

pub struct LtGemmDesc {
    pub desc: sys::cublasLtMatmulDesc_t,
    pub a: sys::cublasLtMatrixLayout_t,
    pub b: sys::cublasLtMatrixLayout_t,
    pub d: sys::cublasLtMatrixLayout_t,
}

impl LtGemmDesc {
    /// The descriptors of `(m, n, k)` with x and w of type `input` and y of type `out`.
    pub fn new(
        input: sys::cudaDataType,
        out: sys::cudaDataType,
        (m, n, k): (usize, usize, usize),
    ) -> anyhow::Result<Self> {
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )?;
        // From here on `g` owns what exists, so an error drops (destroys) it.
        let mut g = LtGemmDesc {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
        };
        let layout = |t, rows: usize, cols: usize| {
            lt::create_matrix_layout(t, rows as u64, cols as u64, rows as i64)
        };
        g.a = layout(input, k, n)?;
        g.b = layout(input, k, m)?;
        g.d = layout(out, n, m)?;
        // SAFETY: the descriptor is live; each value has the attribute's type.
        unsafe {
            // cublasOperation_t: 1 = T, 0 = N.
            set_desc(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &1i32,
            )?;
            set_desc(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                &0i32,
            )?;
        }
        Ok(g)
    }
}

impl Drop for LtGemmDesc {
    fn drop(&mut self) {
        // SAFETY: each was created once and is destroyed once; null ones were never made.
        unsafe {
            for l in [self.a, self.b, self.d] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// Sets one attribute of a matmul descriptor to `value`.
///
/// # Safety
/// `desc` is live and `T` is the attribute's type.
pub unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> anyhow::Result<()> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        value as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .with_context(|| format!("cuBLASLt attribute {attr:?}"))
}
