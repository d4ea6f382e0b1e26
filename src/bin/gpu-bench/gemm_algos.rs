//! `gpu-bench gemm-algos`: a prefill's four linear layers (bf16 x and w, fp32 y; the o and down
//! projections adding into y, as `residual_gemm` runs them) through `gemm::linear` /
//! `linear_add` (cuBLAS's own choice of kernel), against every algorithm cuBLASLt's heuristic
//! offers for the same GEMM. The question: does a kernel exist for these shapes that is faster
//! than the one the heuristic picks, so that timing the candidates at start would pay?
//!
//! Each figure is the median of `REPS` runs of `LAUNCHES` back-to-back launches (the GEMMs draw
//! enough power to lower the clocks, so a lone launch would flatter every candidate alike); the
//! default is timed before and after the candidates.

use std::ffi::c_void;

use anyhow::Context;
use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::gemm::{self, Weight};
use brook::executor::cuda::lt_desc::LtGemmDesc;
use brook::model::synthetic::synthetic_config;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use serde_json::json;

use crate::common::{emit, random_bf16, time_ms_back_to_back};

/// Launches of one timed run.
const LAUNCHES: usize = 8;
/// Runs a figure is the median of.
const REPS: usize = 7;
/// cuBLASLt's workspace, as the fp8 path's.
const WORKSPACE_BYTES: usize = 32 << 20;

pub struct Args<'a> {
    pub model: &'a str,
    /// Rows (tokens) of each GEMM.
    pub tokens: &'a [usize],
    /// Most candidates asked of the heuristic a shape.
    pub algos: usize,
}

/// (layer, n, k, adds into y).
type Layer = (&'static str, usize, usize, bool);

pub fn run(a: &Args) -> anyhow::Result<()> {
    let gpu = Gpu::open(0)?;
    let c = synthetic_config(a.model)?;
    let (d, inter) = (c.hidden_size, c.intermediate_size);
    let layers: [Layer; 4] = [
        ("qkv", c.q_dim() + 2 * c.kv_dim(), d, false),
        ("o", d, c.q_dim(), true),
        ("gate_up", 2 * inter, d, false),
        ("down", d, inter, true),
    ];
    let max_m = a.tokens.iter().copied().max().unwrap_or(0);
    let max_k = layers.iter().map(|l| l.2).max().unwrap_or(0);
    let max_nk = layers.iter().map(|l| l.1 * l.2).max().unwrap_or(0);
    let max_n = layers.iter().map(|l| l.1).max().unwrap_or(0);
    let x = random_bf16(&gpu, max_m * max_k, 1)?;
    let w = random_bf16(&gpu, max_nk, 2)?;
    let y = gpu.alloc(max_m * max_n * 4)?;
    gpu.memset(y.ptr(), 0, max_m * max_n * 4)?;
    let lt = Lt::new(&gpu)?;
    for &m in a.tokens {
        for &(name, n, k, add) in &layers {
            let default = || {
                time_ms_back_to_back(&gpu, 2, REPS, LAUNCHES, |_| {
                    // SAFETY: x holds [m, k], w [n, k] and y [m, n] at least.
                    unsafe {
                        match add {
                            true => gemm::linear_add(
                                &gpu,
                                x.ptr(),
                                Weight::bf16(w.ptr()),
                                y.ptr(),
                                (m, n, k),
                            ),
                            false => gemm::linear(
                                &gpu,
                                None,
                                x.ptr(),
                                Weight::bf16(w.ptr()),
                                y.ptr(),
                                m,
                                n,
                                k,
                                true,
                            ),
                        }
                    }
                })
            };
            let before = default()?;
            let bf16 = sys::cudaDataType::CUDA_R_16BF;
            let plan = LtGemmDesc::new(bf16, sys::cudaDataType::CUDA_R_32F, (m, n, k))?;
            let mut found = Vec::new();
            for (i, algo) in lt.candidates(&plan, a.algos)?.iter().enumerate() {
                let ms = time_ms_back_to_back(&gpu, 2, REPS, LAUNCHES, |_| {
                    // SAFETY: as above.
                    unsafe { lt.matmul(&gpu, (&plan, add), algo, (&x, &w, &y)) }
                });
                match ms {
                    Ok(ms) => found.push((i, ms)),
                    Err(e) => eprintln!("{name} m={m}: candidate {i} failed: {e:#}"),
                }
            }
            let after = default()?;
            let tflops = |ms: f64| 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
            let best = found.iter().copied().min_by(|p, q| p.1.total_cmp(&q.1));
            let cand: Vec<String> = found
                .iter()
                .map(|(i, ms)| format!("{i}:{:.1}", ms * 1e3))
                .collect();
            eprintln!(
                "{} {name} {m}x{n}x{k}{}: cuBLAS default {:.1} / {:.1} us ({:.0} TFLOP/s); cuBLASLt candidates (rank:us) {}; best {}",
                a.model,
                if add { " (+= y)" } else { "" },
                before * 1e3,
                after * 1e3,
                tflops(before.min(after)),
                cand.join(" "),
                best.map_or("none".into(), |(i, ms)| format!(
                    "#{i} {:.1} us ({:.0} TFLOP/s, {:+.1} % against the default)",
                    ms * 1e3,
                    tflops(ms),
                    (ms / before.min(after) - 1.0) * 100.0
                ))
            );
            emit(json!({
                "figure": "gemm_algos", "model": a.model, "layer": name, "m": m, "n": n, "k": k,
                "adds": add, "default_us": [before * 1e3, after * 1e3],
                "candidates_us": found.iter().map(|(i, ms)| json!({"rank": i, "us": ms * 1e3})).collect::<Vec<_>>(),
                "timing": format!("median of {REPS} runs of {LAUNCHES} back-to-back launches"),
            }));
        }
    }
    Ok(())
}

/// A cuBLASLt handle and workspace.
struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: DevBuf,
}

impl Lt {
    fn new(gpu: &Gpu) -> anyhow::Result<Self> {
        Ok(Lt {
            handle: lt::create_handle().context("creating the cuBLASLt handle")?,
            workspace: gpu.alloc(WORKSPACE_BYTES)?,
        })
    }

    /// Up to `most` algorithms the heuristic offers for `plan`'s GEMM, best-ranked first.
    fn candidates(
        &self,
        plan: &LtGemmDesc,
        most: usize,
    ) -> anyhow::Result<Vec<sys::cublasLtMatmulAlgo_t>> {
        let pref = lt::create_matmul_pref()?;
        let limit = WORKSPACE_BYTES as u64;
        let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
            // SAFETY: plain data, written by the heuristic.
            vec![unsafe { std::mem::zeroed() }; most.max(1)];
        let mut count = 0i32;
        // SAFETY: the descriptors are live; `results` has room for `most` entries.
        let status = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &limit as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            );
            let r = set.and_then(|_| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                    results.len() as i32,
                    results.as_mut_ptr(),
                    &mut count,
                )
                .result()
            });
            let _ = lt::destroy_matmul_pref(pref);
            r
        };
        status.map_err(|e| anyhow::anyhow!("cuBLASLt heuristic: {e:?}"))?;
        results.truncate(count.max(0) as usize);
        Ok(results.into_iter().map(|r| r.algo).collect())
    }

    /// `plan`'s GEMM with `algo`.
    ///
    /// # Safety
    /// The buffers hold x [m, k] bf16, w [n, k] bf16 and y [m, n] fp32 at least.
    unsafe fn matmul(
        &self,
        gpu: &Gpu,
        (plan, add): (&LtGemmDesc, bool),
        algo: &sys::cublasLtMatmulAlgo_t,
        (x, w, y): (&DevBuf, &DevBuf, &DevBuf),
    ) -> anyhow::Result<()> {
        let (alpha, beta) = (1.0f32, if add { 1.0f32 } else { 0.0 });
        lt::matmul(
            self.handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            w.ptr() as *const c_void,
            plan.a,
            x.ptr() as *const c_void,
            plan.b,
            y.ptr() as *const c_void,
            plan.d,
            y.ptr() as *mut c_void,
            plan.d,
            algo,
            self.workspace.ptr() as *mut c_void,
            WORKSPACE_BYTES,
            gpu.stream.cu_stream() as sys::cudaStream_t,
        )
        .map_err(|e| anyhow::anyhow!("cublasLtMatmul: {e:?}"))
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created once in `new`.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}
