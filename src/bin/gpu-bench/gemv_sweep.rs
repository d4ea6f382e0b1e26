//! `gpu-bench gemv-sweep`: batch-1 GEMV GB/s on the synthetic models' linear layers, brook's
//! gemv by split and build, its bulk-copy gemv by ring, and cuBLAS.

use anyhow::Context;
use brook::executor::cuda::compile;
use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::gemm;
use brook::executor::cuda::kernels;
use brook::model::synthetic::synthetic_config;
use cudarc::driver::sys::CUfunction_attribute;
use serde_json::json;

use crate::common::{emit, random_bf16, time_ms};

/// Launches per timed sample: they queue as in a decode step, with no event between them.
const INNER: usize = 20;
/// Weights rotate through this many bytes, so no launch reads them from L2.
const REGION: usize = 2 << 30;

/// (model, layer, n, k) of one linear layer.
type Shape = (&'static str, &'static str, usize, usize);

/// The weights region, x and y every variant runs on.
struct Bench {
    gpu: Gpu,
    w: DevBuf,
    x: DevBuf,
    y: DevBuf,
    arch: String,
}

impl Bench {
    /// Median ms of one launch of `launch(weights offset)` over [n, k] weights.
    fn time(
        &self,
        n: usize,
        k: usize,
        launch: &dyn Fn(u64) -> anyhow::Result<()>,
    ) -> anyhow::Result<f64> {
        let bytes = n * k * 2;
        let copies = (REGION / bytes).max(1);
        let ms = time_ms(&self.gpu, 2, 30, |i| {
            for j in 0..INNER {
                launch(self.w.ptr() + (((i * INNER + j) % copies) * bytes) as u64)?;
            }
            Ok(())
        })?;
        Ok(ms / INNER as f64)
    }

    /// `gemv_m1` of gemv.cu (or gemv_bulk.cu), built with `defines` prepended.
    fn build(
        &self,
        file: &str,
        tag: &str,
        defines: &str,
        kernel: &str,
    ) -> anyhow::Result<cudarc::driver::CudaFunction> {
        let src = compile::SOURCES
            .iter()
            .find(|(name, _)| *name == file)
            .with_context(|| format!("{file}.cu is embedded"))?
            .1;
        let (ptx, _) = compile::ptx_for(tag, &format!("{defines}{src}"), &self.arch)?;
        Ok(self.gpu.ctx.load_module(ptx)?.load_function(kernel)?)
    }
}

/// One figure: stderr and a JSON line; `auto` marks what brook runs for the shape.
fn report((model, name, n, k): Shape, variant: &str, auto: bool, ms: f64) {
    let gbps = (n * k * 2) as f64 / (ms * 1e-3) / 1e9;
    eprintln!(
        "gemv {model} {name} {n}x{k} {variant}{}: {:.1} us, {gbps:.0} GB/s",
        if auto { " (auto)" } else { "" },
        ms * 1e3
    );
    emit(
        json!({"figure": "gemv_b1", "model": model, "layer": name, "n": n, "k": k, "variant": variant, "auto": auto, "us": ms * 1e3, "gbps": gbps, "pct_of_4300": gbps / 43.0, "timing": "median of 30 x 20 back-to-back launches"}),
    );
}

/// Batch-1 GEMV on the linear layers of the synthetic models: GB/s of weights streamed by
/// brook's gemv kernel at each split (warps per row) for a few (warps per CTA, 16-byte loads in
/// flight per lane) builds, by the bulk-copy kernel for a few rings (`bulk_builds`), and by
/// cuBLAS. Each figure is the median of 30 runs of `INNER` back-to-back launches, divided by
/// `INNER`.
pub fn run() -> anyhow::Result<()> {
    let gpu = Gpu::open(0)?;
    let (major, minor) = gpu.compute_capability;
    let mut shapes: Vec<Shape> = Vec::new();
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
    let mut b = Bench {
        w: random_bf16(&gpu, REGION / 2, 1)?,
        x: random_bf16(&gpu, max_k, 2)?,
        y: gpu.alloc(max_n * 4)?,
        arch: compile::arch_for(major, minor),
        gpu,
    };
    split_builds(&b, &shapes)?;
    if b.gpu.gemv_bulk {
        bulk_builds(&b, &shapes)?;
    }
    b.gpu.gemv_max_m = 0; // cuBLAS for every row count
    for &shape in &shapes {
        let (_, _, n, k) = shape;
        let launch = |wp: u64| {
            // SAFETY: w holds copies of [n, k], x [1, k], y [1, n].
            unsafe {
                gemm::linear(
                    &b.gpu,
                    None,
                    b.x.ptr(),
                    gemm::Weight::bf16(wp),
                    b.y.ptr(),
                    1,
                    n,
                    k,
                    false,
                )
            }
        };
        report(shape, "cublas", false, b.time(n, k, &launch)?);
    }
    Ok(())
}

/// gemv.cu's `gemv_m1` over `shapes` at every split, for a few (warps a CTA, loads in flight a
/// lane) builds; `auto` marks the build and split brook runs where the bulk kernel does not.
fn split_builds(b: &Bench, shapes: &[Shape]) -> anyhow::Result<()> {
    for (warps, unroll) in [(8u32, 2usize), (8, 4), (4, 2), (16, 2)] {
        let defines = format!("#define GEMV_WARPS {warps}\n#define GEMV_UNROLL {unroll}\n");
        let f = b.build(
            "gemv",
            &format!("gemv_w{warps}_u{unroll}"),
            &defines,
            "gemv_m1",
        )?;
        let shipped = warps == kernels::GEMV_WARPS && unroll == kernels::GEMV_UNROLL;
        for &shape in shapes {
            let (_, _, n, k) = shape;
            for split in [1u32, 2, 4, 8].into_iter().filter(|s| warps % s == 0) {
                let launch = |wp: u64| {
                    let p = kernels::GemvParams {
                        x: b.x.ptr(),
                        w: wp,
                        y: b.y.ptr(),
                        y32: 0,
                        m: 1,
                        n: n as i32,
                        k: k as i32,
                        split: split as i32,
                        w_scale: 0,
                    };
                    let grid = ((n as u32).div_ceil(warps / split), 1, 1);
                    // SAFETY: w holds copies of [n, k], x [1, k], y [1, n].
                    unsafe {
                        b.gpu
                            .launch_fn(&f, "gemv_m1", (grid, (32 * warps, 1, 1), 0), &p)
                    }
                };
                let auto = shipped
                    && kernels::gemv_split(&b.gpu, k) == split as i32
                    && kernels::gemv_bulk_grid(&b.gpu, 1, n, k).is_none();
                let variant = format!("brook w{warps} u{unroll} s{split}");
                report(shape, &variant, auto, b.time(n, k, &launch)?);
            }
        }
    }
    Ok(())
}

/// The bulk-copy gemv (gemv_bulk.cu) over `shapes` for a few (stage bytes, stages, L2 policy,
/// consumer warps) builds: the first is the one brook ships, the second its ring alone
/// (`GB_DIAG 1`: stages read and dropped, no arithmetic; a ceiling, its output garbage).
fn bulk_builds(b: &Bench, shapes: &[Shape]) -> anyhow::Result<()> {
    // (stage bytes, stages, evict-first, GB_DIAG, consumer warps)
    let builds = [
        (
            kernels::GEMV_BULK_STAGE_BYTES,
            kernels::GEMV_BULK_STAGES,
            1,
            0,
            kernels::GEMV_BULK_THREADS / 32 - 1,
        ),
        (4096, 32, 1, 1, 16),
        (4096, 32, 0, 0, 16),
        (4096, 32, 1, 0, 8),
        (8192, 16, 1, 0, 16),
        (2048, 64, 1, 0, 16),
    ];
    // The ring, then x of the longest row, then the largest accumulator.
    let x_bytes = 2 * shapes.iter().map(|s| s.3).max().unwrap_or(0);
    for (i, (stage, stages, evict, diag, warps)) in builds.into_iter().enumerate() {
        let defines = format!(
            "#define GB_STAGE_BYTES {stage}\n#define GB_STAGES {stages}\n#define GB_EVICT_FIRST {evict}\n#define GB_DIAG {diag}\n#define GB_WARPS {warps}\n"
        );
        let tag = format!("gemv_bulk_s{stage}_n{stages}_e{evict}_d{diag}_w{warps}");
        let f = b.build("gemv_bulk", &tag, &defines, "gemv_bulk_m1")?;
        let smem = stage * stages + x_bytes + 4 * kernels::GEMV_BULK_ACC_FLOATS;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
        for &shape in shapes {
            let (_, _, n, k) = shape;
            if 2 * k < stage {
                continue; // rows shorter than a stage: the kernel does not take them
            }
            let launch = |wp: u64| {
                let p = kernels::GemvBulkParams {
                    x: b.x.ptr(),
                    w: wp,
                    y: b.y.ptr(),
                    y32: 0,
                    m: 1,
                    n: n as i32,
                    k: k as i32,
                };
                let grid = ((b.gpu.num_sms as usize).min(n) as u32, 1, 1);
                let shape = (grid, (32 * (warps + 1), 1, 1), smem as u32);
                // SAFETY: w holds copies of [n, k], x [1, k], y [1, n].
                unsafe { b.gpu.launch_fn(&f, "gemv_bulk_m1", shape, &p) }
            };
            let variant = format!("bulk {stage}x{stages} evict{evict} diag{diag} w{warps}");
            let auto = i == 0 && kernels::gemv_bulk_grid(&b.gpu, 1, n, k).is_some();
            report(shape, &variant, auto, b.time(n, k, &launch)?);
        }
    }
    Ok(())
}
