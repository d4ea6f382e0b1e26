//! fp8 (e4m3) GEMMs for `--quantization fp8`: y = (x quantized, one dynamic scale) · (w, e4m3
//! with its scale)ᵀ on the tensor cores through cuBLASLt, whose epilogue multiplies by both
//! scales (device scalars: x's is computed on the GPU each call, so it replays in CUDA graphs).
//! Per-token and per-channel scales would keep more precision, but cuBLASLt's outer-vector
//! scaling answered CUBLAS_STATUS_INVALID_VALUE on the H200 (CUDA 13.0), so both are per
//! tensor, as vLLM's default dynamic fp8. Decode's few rows never come here: `gemm::linear`
//! sends them to `gemv_fp8`, which reads the e4m3 weights directly.
//!
//! cuBLASLt's descriptors, layouts and algorithm choice cost the host tens of µs to build, so
//! they are kept per (rows, n, k, output type) — a plan — and reused; the weight's scale
//! pointer is the one attribute set per call. The cache is bounded: a server's prefill steps
//! come in many row counts.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

use anyhow::Context;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use super::device::{DevBuf, Gpu};
use super::kernels::{self, QuantizeE4m3, AMAX_MAX_CTAS};
use super::lt_desc::{set_desc, LtGemmDesc};

/// cuBLASLt's workspace (NVIDIA suggests 32 MiB on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// Plans kept before the cache starts over.
const MAX_PLANS: usize = 1024;

/// (rows m, outputs n, inner k, fp32 output).
type PlanKey = (usize, usize, usize, bool);

/// The per-tensor e4m3 quantizer (kernels/quant_fp8.cu) and its scratch: the partial maxima and
/// the arrival counter, zeroed once (the kernel resets it after each use). Quantizes the weights
/// at load (`GpuWeights::quantize_fp8`) and each fp8 GEMM's input (`Fp8Gemm`).
pub struct E4m3Quantizer {
    partial: DevBuf,
    counter: DevBuf,
}

impl E4m3Quantizer {
    pub fn new(gpu: &Gpu) -> anyhow::Result<Self> {
        gpu.check_fp8("e4m3 quantization")?;
        let counter = gpu.alloc(4)?;
        gpu.memset(counter.ptr(), 0, 4)?;
        Ok(E4m3Quantizer {
            partial: gpu.alloc(AMAX_MAX_CTAS * 4)?,
            counter,
        })
    }

    /// `n` bf16 at `x` to e4m3 at `q` with one scale: `scale` receives `[s, 1 / s]`.
    ///
    /// # Safety
    /// `x` holds n bf16, `q` n bytes and `scale` two floats on `gpu`; one launch at a time (the
    /// scratch is shared, stream order keeps it so).
    pub unsafe fn run(
        &self,
        gpu: &Gpu,
        (x, q, scale): (u64, u64, u64),
        n: usize,
    ) -> anyhow::Result<()> {
        kernels::quantize_e4m3(
            gpu,
            &QuantizeE4m3 {
                x,
                q,
                scale,
                partial: self.partial.ptr(),
                counter: self.counter.ptr(),
                n,
            },
        )
    }
}

/// State of the fp8 GEMM path: the cuBLASLt handle and workspace, the quantizer with the
/// activations' e4m3 copy and scale, and the plans.
pub struct Fp8Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: DevBuf,
    quant: E4m3Quantizer,
    /// `[max_rows, max_k]` e4m3: the GEMM's input.
    xq: DevBuf,
    /// `[2]` f32: its scale and the scale's inverse.
    xs: DevBuf,
    max_rows: usize,
    max_k: usize,
    /// Owned by the backend's one thread: no lock.
    plans: RefCell<HashMap<PlanKey, Plan>>,
}

// SAFETY: the handle and the plans' descriptors are plain host objects that cuBLASLt allows to
// be used from any thread, one call at a time; the backend that owns the `Fp8Gemm` is moved
// between threads, never shared (it is not Sync).
unsafe impl Send for Fp8Gemm {}

impl Fp8Gemm {
    /// For GEMMs of up to `max_rows` rows and `max_k` inner size (the `Forward` holds one for
    /// `--quantization fp8` and hands it to `gemm::linear`). Needs sm_89+.
    pub fn new(gpu: &Gpu, max_rows: usize, max_k: usize) -> anyhow::Result<Self> {
        let quant = E4m3Quantizer::new(gpu)?;
        let handle = lt::create_handle().context("creating the cuBLASLt handle")?;
        Ok(Fp8Gemm {
            handle,
            workspace: gpu.alloc(WORKSPACE_BYTES)?,
            quant,
            xq: gpu.alloc(max_rows * max_k)?,
            xs: gpu.alloc(2 * 4)?,
            max_rows,
            max_k,
            plans: RefCell::new(HashMap::new()),
        })
    }

    /// Its quantizer (the weights' too, at load).
    pub fn quantizer(&self) -> &E4m3Quantizer {
        &self.quant
    }

    /// y[m, n] = x[m, k] · w[n, k]ᵀ with w e4m3 and `w_scale` its scale; x bf16 is quantized
    /// first. y bf16, or fp32 when `y_f32`.
    ///
    /// # Safety
    /// The pointers address buffers of those shapes on `gpu`.
    #[allow(clippy::too_many_arguments)] // the GEMM's own shape
    pub unsafe fn linear(
        &self,
        gpu: &Gpu,
        x: u64,
        (w, w_scale): (u64, u64),
        y: u64,
        (m, n, k): (usize, usize, usize),
        y_f32: bool,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            m <= self.max_rows && k <= self.max_k && k % 16 == 0 && n % 8 == 0,
            "fp8 GEMM m={m} n={n} k={k}: at most {} rows and k {}, k % 16 == 0, n % 8 == 0",
            self.max_rows,
            self.max_k
        );
        self.quant
            .run(gpu, (x, self.xq.ptr(), self.xs.ptr()), m * k)?;
        let mut plans = self.plans.borrow_mut();
        let key = (m, n, k, y_f32);
        if !plans.contains_key(&key) {
            if plans.len() >= MAX_PLANS {
                plans.clear();
            }
            let plan = Plan::new(self.handle, key, self.xs.ptr(), WORKSPACE_BYTES)
                .with_context(|| format!("no cuBLASLt fp8 GEMM for m={m} n={n} k={k}"))?;
            plans.insert(key, plan);
        }
        let plan = &plans[&key];
        let scale = w_scale as *const c_void;
        set_desc(
            plan.lt.desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            &scale,
        )?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        lt::matmul(
            self.handle,
            plan.lt.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            w as *const c_void,
            plan.lt.a,
            self.xq.ptr() as *const c_void,
            plan.lt.b,
            y as *const c_void,
            plan.lt.d,
            y as *mut c_void,
            plan.lt.d,
            &plan.algo,
            self.workspace.ptr() as *mut c_void,
            WORKSPACE_BYTES,
            gpu.stream.cu_stream() as sys::cudaStream_t,
        )
        .with_context(|| format!("cublasLtMatmul fp8 m={m} n={n} k={k}"))?;
        gpu.traced(format_args!("fp8 gemm {m}x{n}x{k}"))
    }
}

impl Drop for Fp8Gemm {
    fn drop(&mut self) {
        self.plans.get_mut().clear();
        // SAFETY: every plan made with the handle is gone.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// One GEMM shape's descriptors (`LtGemmDesc`: A is the e4m3 weight, B its quantized input) and
/// algorithm.
struct Plan {
    lt: LtGemmDesc,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Plan {
    fn new(
        handle: sys::cublasLtHandle_t,
        (m, n, k, y_f32): PlanKey,
        x_scale: u64,
        workspace: usize,
    ) -> anyhow::Result<Plan> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let out = match y_f32 {
            true => sys::cudaDataType::CUDA_R_32F,
            false => sys::cudaDataType::CUDA_R_16BF,
        };
        let lt_desc = LtGemmDesc::new(sys::cudaDataType::CUDA_R_8F_E4M3, out, (m, n, k))?;
        let desc = lt_desc.desc;
        let x_scale = x_scale as *const c_void;
        // SAFETY: the descriptor is live; each value has the attribute's type.
        unsafe {
            // Accumulation without cuBLASLt's periodic promotion, as vLLM's fp8 GEMMs on sm_90.
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &1i8)?;
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale)?;
        }
        let pref = lt::create_matmul_pref()?;
        let limit = workspace as u64;
        // SAFETY: every descriptor is live; the preference is destroyed on both paths.
        let found = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &limit as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            );
            let found = set.and_then(|_| {
                lt::get_matmul_algo_heuristic(
                    handle, desc, lt_desc.a, lt_desc.b, lt_desc.d, lt_desc.d, pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            found
        };
        let algo = found
            .map_err(|e| anyhow::anyhow!("{e:?} (fp8 GEMMs need cuBLASLt on sm_89+)"))?
            .algo;
        Ok(Plan { lt: lt_desc, algo })
    }
}
