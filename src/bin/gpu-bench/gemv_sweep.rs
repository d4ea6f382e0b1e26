//! `gpu-bench gemv-sweep`: batch-1 GEMV GB/s on the synthetic models' linear layers, brook's
//! gemv by split and build against cuBLAS.

use anyhow::Context;
use brook::executor::cuda::compile;
use brook::executor::cuda::device::Gpu;
use brook::executor::cuda::gemm;
use brook::executor::cuda::kernels;
use brook::model::synthetic::synthetic_config;
use serde_json::json;

use crate::common::{emit, random_bf16, time_ms};

/// Batch-1 GEMV on the linear layers of the synthetic models: GB/s of weights streamed by
/// brook's gemv kernel at each split (warps per row) for a few (warps per CTA, 16-byte loads in
/// flight per lane) builds, and by cuBLAS. Each figure is the median of 30 runs of 20 back-to-back
/// launches (kernels queue as in a decode step, with no event between them), divided by 20;
/// weights rotate through 2 GiB so no launch reads them from L2.
pub fn run() -> anyhow::Result<()> {
    const INNER: usize = 20;
    let mut gpu = Gpu::open(0)?;
    let (major, minor) = gpu.compute_capability;
    let arch = compile::arch_for(major, minor);
    let src = compile::SOURCES
        .iter()
        .find(|(name, _)| *name == "gemv")
        .context("gemv.cu is embedded")?
        .1;
    let region = 2usize << 30;
    let w = random_bf16(&gpu, region / 2, 1)?;
    let mut shapes = Vec::new();
    for model in ["llama-2-7b", "llama-3-8b", "tinyllama-1.1b"] {
        let c = synthetic_config(model)?;
        let (d, inter) = (c.hidden_size, c.intermediate_size);
        shapes.extend([
            (model, "qkv", c.q_dim() + 2 * c.kv_dim(), d),
            (model, "o", d, c.q_dim()),
            (model, "gate_up", 2 * inter, d),
            (model, "down", d, inter),
            (model, "lm_head", c.vocab_size, d),
        ]);
    }
    let max_k = shapes.iter().map(|s| s.3).max().unwrap_or(0);
    let max_n = shapes.iter().map(|s| s.2).max().unwrap_or(0);
    let x = random_bf16(&gpu, max_k, 2)?;
    let y = gpu.alloc(max_n * 4)?;
    // Median ms of one launch of `launch(weights offset)` over [n, k] weights.
    let time = |gpu: &Gpu, n: usize, k: usize, launch: &dyn Fn(u64) -> anyhow::Result<()>| {
        let bytes = n * k * 2;
        let copies = (region / bytes).max(1);
        let ms = time_ms(gpu, 2, 30, |i| {
            for j in 0..INNER {
                launch(w.ptr() + (((i * INNER + j) % copies) * bytes) as u64)?;
            }
            Ok(())
        })?;
        Ok::<f64, anyhow::Error>(ms / INNER as f64)
    };
    let rate = |model: &str, name: &str, variant: &str, n: usize, k: usize, auto: bool, ms: f64| {
        let gbps = (n * k * 2) as f64 / (ms * 1e-3) / 1e9;
        eprintln!(
            "gemv {model} {name} {n}x{k} {variant}{}: {:.1} us, {gbps:.0} GB/s",
            if auto { " (auto)" } else { "" },
            ms * 1e3
        );
        emit(
            json!({"figure": "gemv_b1", "model": model, "layer": name, "n": n, "k": k, "variant": variant, "auto": auto, "us": ms * 1e3, "gbps": gbps, "pct_of_4300": gbps / 43.0, "timing": "median of 30 x 20 back-to-back launches"}),
        );
    };
    for (warps, unroll) in [(8u32, 2usize), (8, 4), (4, 2), (16, 2)] {
        let text = format!("#define GEMV_WARPS {warps}\n#define GEMV_UNROLL {unroll}\n{src}");
        let (ptx, _) = compile::ptx_for(&format!("gemv_w{warps}_u{unroll}"), &text, &arch)?;
        let module = gpu.ctx.load_module(ptx)?;
        let f = module.load_function("gemv_m1")?;
        // The build brook ships: mark the split it picks per shape.
        let shipped = warps == kernels::GEMV_WARPS && unroll == kernels::GEMV_UNROLL;
        for &(model, name, n, k) in &shapes {
            for split in [1u32, 2, 4, 8].into_iter().filter(|s| warps % s == 0) {
                let launch = |wp: u64| {
                    let p = kernels::GemvParams {
                        x: x.ptr(),
                        w: wp,
                        y: y.ptr(),
                        y32: 0,
                        m: 1,
                        n: n as i32,
                        k: k as i32,
                        split: split as i32,
                        w_scale: 0,
                    };
                    let rows_per_cta = warps / split;
                    // SAFETY: w holds copies x [n, k], x [1, k], y [1, n].
                    unsafe {
                        gpu.launch_fn(
                            &f,
                            "gemv_m1",
                            ((n as u32).div_ceil(rows_per_cta), 1, 1),
                            (32 * warps, 1, 1),
                            &p,
                        )
                    }
                };
                let ms = time(&gpu, n, k, &launch)?;
                let auto = shipped && kernels::gemv_split(&gpu, k) == split as i32;
                let variant = format!("brook w{warps} u{unroll} s{split}");
                rate(model, name, &variant, n, k, auto, ms);
            }
        }
    }
    gpu.gemv_max_m = 0; // cuBLAS for every row count
    for &(model, name, n, k) in &shapes {
        let launch = |wp: u64| {
            // SAFETY: as above.
            unsafe {
                gemm::linear(
                    &gpu,
                    None,
                    x.ptr(),
                    gemm::Weight::bf16(wp),
                    y.ptr(),
                    1,
                    n,
                    k,
                    false,
                )
            }
        };
        let ms = time(&gpu, n, k, &launch)?;
        rate(model, name, "cublas", n, k, false, ms);
    }
    Ok(())
}
