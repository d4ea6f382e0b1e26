//! `gpu-bench stream-floor`: how fast one token's linear weights can be streamed at batch 1,
//! with and without kernel boundaries — the question a persistent (one launch a step) decode
//! path would answer. Each variant reads the same bytes (every linear layer of the model, then
//! the LM head, laid out one after another in one buffer):
//!
//! - `ring, one launch`: the bulk gemv's ring alone (`GB_DIAG 1`: stages read and dropped) over
//!   all of it as one matrix of 64 KB rows: the weight stream with no boundary at all.
//! - `gemv, one launch`: the shipped bulk gemv over the same matrix (its arithmetic included).
//! - `ring, per matrix (PDL)` and `(no PDL)`: the ring alone, one launch per layer matrix.
//! - `ring + loads, one launch` and `per matrix (PDL)`: the ring with every stage read into
//!   registers (`GB_DIAG 3`; `GB_DIAG 1` keeps a stage's first step of loads only): the
//!   shipped kernel less its arithmetic.
//! - `gemv, per matrix (PDL)`: the shipped kernel, one launch per matrix, as a decode step
//!   launches them (`kernels::gemv`, as `Gpu::open` leaves it: `GemvSmem::Roomy`), without the
//!   kernels between them; then launched `GemvSmem::Tight` and `Deep` (brook's default: a
//!   48-stage ring where x fits beside it).
//! - `gemv r16 x2 tight, per matrix (PDL)`: the kernel built with a 16-stage ring and launch
//!   bounds for 2 CTAs an SM, asking only for the shared memory a launch uses, so that a
//!   launch's CTAs fit beside the previous launch's and fill their rings while it drains (a
//!   32-stage CTA gets onto an SM only once the one before has left it). Outputs checked against
//!   the shipped gemv's.
//! - `chain, one launch (grid barriers)`: kernels/gemv_chain.cu, every matrix in one
//!   cooperative launch with a grid barrier between matrices (the skeleton of a persistent
//!   decode step); then as many ops of one stage a CTA: what a barrier and an op's fixed work
//!   cost alone. Outputs checked against the shipped gemv's.
//! - `device copy`: one device-to-device copy of 4 GiB (bytes read; as many are written).
//! - Then the per-matrix chain once more on a build that stamps each CTA's progress, roomy and
//!   tight: where a boundary's time goes (`boundary_stamps`).
//!
//! The decode step itself (`gpu-bench decode --quick`) adds norms, RoPE, attention, SiLU and
//! sampling to the per-matrix chain.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{result, CudaFunction};
use serde_json::json;

use brook::executor::cuda::compile;
use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::kernels::{self, ChainOp, GemvChainParams};
use brook::executor::cuda::GemvSmem;
use brook::model::synthetic::synthetic_config;

use crate::boundary_stamps;
use crate::common::{emit, random_bf16, read_bf16, rel_err, time_ms};

/// Row length of the one-launch view: 64 KB rows keep a CTA's rows under the kernel's
/// accumulator (`GB_ACC_FLOATS`) and x under its shared-memory slot.
const FLAT_K: usize = 32 * 1024;
const COPY_BYTES: usize = 4 << 30;

/// (n, k) of each linear layer in a token's order, then the LM head.
fn matrices(model: &str) -> anyhow::Result<Vec<(usize, usize)>> {
    let c = synthetic_config(model)?;
    let (d, inter) = (c.hidden_size, c.intermediate_size);
    let layer = [
        (c.q_dim() + 2 * c.kv_dim(), d),
        (d, c.q_dim()),
        (2 * inter, d),
        (d, inter),
    ];
    let mut out: Vec<(usize, usize)> = (0..c.num_hidden_layers).flat_map(|_| layer).collect();
    out.push((c.vocab_size, d));
    Ok(out)
}

/// A build of gemv_bulk.cu's one-row kernel for the floor: `stages` ring stages of the shipped
/// size, launch bounds for `min_ctas` CTAs an SM, `diag` its `GB_DIAG` (1: the ring alone,
/// outputs garbage; 2: the full kernel stamping its CTAs' progress into y32,
/// `boundary_stamps`); shared memory allowed for the ring and x of `FLAT_K`.
struct Bulk {
    f: CudaFunction,
    stages: usize,
}

impl Bulk {
    fn build(gpu: &Gpu, stages: usize, min_ctas: usize, diag: u8) -> anyhow::Result<Bulk> {
        Self::build_dots(gpu, stages, min_ctas, diag, true)
    }

    /// `build` with the dots on tensor cores (`mma`, `GB_MMA 1`, as shipped) or scalar FMAs.
    fn build_dots(
        gpu: &Gpu,
        stages: usize,
        min_ctas: usize,
        diag: u8,
        mma: bool,
    ) -> anyhow::Result<Bulk> {
        let (major, minor) = gpu.compute_capability;
        let src = compile::SOURCES
            .iter()
            .find(|(name, _)| *name == "gemv_bulk")
            .map(|(_, s)| *s)
            .ok_or_else(|| anyhow::anyhow!("gemv_bulk.cu is not embedded"))?;
        let defines = format!(
            "#define GB_STAGE_BYTES {}\n#define GB_STAGES {stages}\n#define GB_MIN_CTAS \
             {min_ctas}\n#define GB_DIAG {}\n#define GB_MMA {}\n",
            compile::GEMV_BULK_STAGE_BYTES,
            diag,
            mma as u8
        );
        let arch = compile::arch_for(major, minor);
        let name = format!(
            "gemv_bulk_floor_s{stages}_c{min_ctas}_d{diag}_m{}",
            mma as u8
        );
        let (ptx, _) = compile::ptx_for(&name, &format!("{defines}{src}"), &arch)?;
        let f = gpu.ctx.load_module(ptx)?.load_function("gemv_bulk_m1")?;
        let b = Bulk { f, stages };
        f_allow(&b.f, b.smem(FLAT_K))?;
        Ok(b)
    }

    /// Dynamic shared memory for rows of `k`: the ring, then x [1, k], then the largest
    /// accumulator.
    fn smem(&self, k: usize) -> u32 {
        (self.stages * compile::GEMV_BULK_STAGE_BYTES
            + (2 * k).next_multiple_of(16)
            + 4 * compile::GEMV_BULK_ACC_FLOATS) as u32
    }
}

/// Lets `f` take `bytes` of dynamic shared memory.
fn f_allow(f: &CudaFunction, bytes: u32) -> anyhow::Result<()> {
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )?;
    Ok(())
}

/// The chain over every matrix of `mats` (laid out from `base`), each with x and its own slot
/// of `y` (one after another); the same number of ops of one stage a CTA (`sync_ops`: the cost
/// of the barriers and the ops' fixed work alone); its barrier.
struct Chain {
    ops: DevBuf,
    sync_ops: DevBuf,
    count: usize,
    y: DevBuf,
    barrier: DevBuf,
}

impl Chain {
    fn new(gpu: &Gpu, mats: &[(usize, usize)], base: u64, x: u64) -> anyhow::Result<Chain> {
        let y = gpu.alloc(mats.iter().map(|m| m.0 * 2).sum())?;
        let (mut w, mut yo) = (base, y.ptr());
        let recs: Vec<ChainOp> = mats
            .iter()
            .map(|&(n, k)| {
                let r = ChainOp::plain(w, x, yo, n, k);
                w += (n * k * 2) as u64;
                yo += (n * 2) as u64;
                r
            })
            .collect();
        let upload = |recs: &[ChainOp]| -> anyhow::Result<DevBuf> {
            let buf = gpu.alloc(std::mem::size_of_val(recs))?;
            gpu.upload(buf.ptr(), recs)?;
            Ok(buf)
        };
        let sms = gpu.num_sms as usize;
        let k = CHAIN_STAGE_BYTES / 2;
        let sync: Vec<ChainOp> = (0..recs.len())
            .map(|_| ChainOp::plain(base, x, y.ptr(), sms, k))
            .collect();
        let barrier = gpu.alloc(8)?;
        gpu.memset(barrier.ptr(), 0, 8)?;
        Ok(Chain {
            ops: upload(&recs)?,
            sync_ops: upload(&sync)?,
            count: recs.len(),
            y,
            barrier,
        })
    }

    /// The chain over the model's matrices (or `sync_only`: the one-stage ops).
    fn launch(&self, gpu: &Gpu, sync_only: bool) -> anyhow::Result<()> {
        let p = GemvChainParams {
            ops: if sync_only {
                self.sync_ops.ptr()
            } else {
                self.ops.ptr()
            },
            count: self.count as i32,
            m: 1,
            barrier: self.barrier.ptr(),
        };
        // SAFETY: each op's w [n, k] lies inside the weights, x holds FLAT_K >= k, its y slot
        // n; the barrier was zeroed and each launch leaves it ready for the next.
        unsafe { kernels::gemv_chain(gpu, &p, CHAIN_STAGE_BYTES) }
    }
}

/// The chain's build for Llama-sized rows (the shipped ring's stages).
const CHAIN_STAGE_BYTES: usize = 4096;

/// Ring stages of the two-CTAs-an-SM build: with x of an 11008-long row and the accumulator,
/// two such CTAs fit an SM's 228 KB (32 would not; stages are a multiple of the 16 warps).
const PAIR_STAGES: usize = 16;

struct Floor {
    gpu: Gpu,
    /// Every matrix of `mats`, one after another.
    w: DevBuf,
    x: DevBuf,
    y: DevBuf,
    /// The ring alone (`Bulk::build` with `diag`), launched with room for x of `FLAT_K`.
    ring: Bulk,
    /// 16 stages, 2 CTAs an SM, launched tight.
    pair: Bulk,
    /// The shipped kernel stamping its CTAs' progress (`GB_DIAG 2`, `boundary_stamps`).
    stamped: Bulk,
    /// The ring with every stage read into registers, no arithmetic (`GB_DIAG 3`), launched
    /// tight.
    loads: Bulk,
    /// The full kernel with scalar dots (`GB_MMA 0`, before session 44), launched tight.
    scalar: Bulk,
}

impl Floor {
    fn params(&self, w: u64, n: usize, k: usize) -> kernels::GemvParams {
        kernels::GemvParams {
            x: self.x.ptr(),
            w,
            y: self.y.ptr(),
            y32: 0,
            m: 1,
            n: n as i32,
            k: k as i32,
            split: kernels::gemv_split(&self.gpu, k),
            w_scale: 0,
        }
    }

    /// One ring launch over [n, k] at `w`, PDL or not.
    fn ring(&self, w: u64, n: usize, k: usize, pdl: bool) -> anyhow::Result<()> {
        self.bulk(&self.ring, self.ring.smem(FLAT_K), (w, n, k), pdl, 0)
            .map(drop)
    }

    /// One launch of build `b` over [n, k] at `w` with `smem` bytes of dynamic shared memory
    /// (at least `b.smem(k)`), PDL or not; `stamps`, when not 0, the stamped build's buffer
    /// (its y32: u64 [CTAs][`boundary_stamps::POINTS`]). Returns its CTA count.
    fn bulk(
        &self,
        b: &Bulk,
        smem: u32,
        (w, n, k): (u64, usize, usize),
        pdl: bool,
        stamps: u64,
    ) -> anyhow::Result<usize> {
        anyhow::ensure!(
            smem >= b.smem(k) && k <= FLAT_K,
            "bulk launch: x [1, {k}] does not fit"
        );
        let grid = (self.gpu.num_sms as usize).min(n);
        let shape = (
            (grid as u32, 1, 1),
            (compile::GEMV_BULK_THREADS, 1, 1),
            smem,
        );
        let p = kernels::GemvBulkParams {
            y32: stamps,
            ..kernels::GemvBulkParams::from(&self.params(w, n, k))
        };
        // SAFETY: w holds [n, k] bf16 inside `self.w`, x [1, k] with k <= FLAT_K (the shared
        // memory holds it after the ring), y [n] (the diagnostic build writes garbage there,
        // within n); stamps, where set, grid x POINTS u64 (boundary_stamps::run).
        unsafe {
            match pdl {
                true => self
                    .gpu
                    .launch_fn_pdl(&b.f, "gemv_bulk_m1 (floor)", shape, &p),
                false => self.gpu.launch_fn(&b.f, "gemv_bulk_m1 (floor)", shape, &p),
            }
        }?;
        Ok(grid)
    }

    /// The stamped build over [n, k] at `w` with PDL, its stamps into `stamps` (u64 [CTAs]
    /// [`boundary_stamps::POINTS`]), with room for x of `FLAT_K` (as the shipped roomy launch)
    /// or tight; returns its CTA count.
    fn stamped(
        &self,
        w: u64,
        n: usize,
        k: usize,
        stamps: u64,
        tight: bool,
    ) -> anyhow::Result<usize> {
        let b = &self.stamped;
        self.bulk(
            b,
            b.smem(if tight { k } else { FLAT_K }),
            (w, n, k),
            true,
            stamps,
        )
    }

    /// Build `b` launched tight over [n, k] at `w` with PDL.
    fn tight(&self, b: &Bulk, w: u64, n: usize, k: usize) -> anyhow::Result<()> {
        self.bulk(b, b.smem(k), (w, n, k), true, 0).map(drop)
    }

    /// The bulk gemv over [n, k] at `w` launched as `mode` says (`GemvSmem`).
    fn gemv_mode(&self, w: u64, n: usize, k: usize, mode: GemvSmem) -> anyhow::Result<()> {
        let p = self.params(w, n, k);
        // SAFETY: as `ring`.
        let took = unsafe { kernels::gemv_bulk_with(&self.gpu, &p, mode)? };
        anyhow::ensure!(took, "the bulk gemv does not take [{n}, {k}]");
        Ok(())
    }

    /// The shipped gemv (bulk kernel where it takes the shape) over [n, k] at `w`.
    fn gemv(&self, w: u64, n: usize, k: usize) -> anyhow::Result<()> {
        let p = self.params(w, n, k);
        // SAFETY: as `ring`.
        unsafe { kernels::gemv(&self.gpu, &p) }
    }
}

fn report(model: &str, variant: &str, bytes: usize, launches: usize, ms: f64) {
    let tbps = bytes as f64 / (ms * 1e-3) / 1e12;
    eprintln!(
        "stream floor {model} {variant}: {ms:.3} ms for {:.2} GB in {launches} launches, \
         {tbps:.2} TB/s ({:.1}% of 4.3)",
        bytes as f64 / 1e9,
        tbps / 4.3 * 100.0
    );
    emit(
        json!({"figure": "stream_floor", "model": model, "variant": variant, "bytes": bytes,
        "launches": launches, "ms": ms, "tbps": tbps, "pct_of_4300": tbps / 4.3 * 100.0,
        "timing": "median of 10 after 2 warm-up"}),
    );
}

pub fn run(model: &str) -> anyhow::Result<()> {
    let mut gpu = Gpu::open(0)?;
    anyhow::ensure!(
        gpu.gemv_bulk,
        "the bulk gemv is off on this GPU (sm_90+ with ~225 KB of shared memory)"
    );
    let mats = matrices(model)?;
    let total: usize = mats.iter().map(|(n, k)| n * k * 2).sum();
    let flat_n = total / (2 * FLAT_K);
    let max_n = mats.iter().map(|m| m.0).max().unwrap_or(0).max(flat_n);
    let ring = Bulk::build(&gpu, compile::GEMV_BULK_STAGES, 1, 1)?;
    let pair = Bulk::build(&gpu, PAIR_STAGES, 2, 0)?;
    let stamped = Bulk::build(&gpu, compile::GEMV_BULK_STAGES, 1, 2)?;
    let loads = Bulk::build(&gpu, compile::GEMV_BULK_STAGES, 1, 3)?;
    let scalar = Bulk::build_dots(&gpu, compile::GEMV_BULK_STAGES, 1, 0, false)?;
    gpu.load_gemv_chain(CHAIN_STAGE_BYTES)?;
    let f = Floor {
        w: random_bf16(&gpu, total / 2, 1)?,
        x: random_bf16(&gpu, FLAT_K, 2)?,
        y: gpu.alloc(max_n * 2)?,
        ring,
        pair,
        stamped,
        loads,
        scalar,
        gpu,
    };
    let base = f.w.ptr();
    let per_matrix = |run: &dyn Fn(u64, usize, usize) -> anyhow::Result<()>| {
        let mut off = 0u64;
        for &(n, k) in &mats {
            run(base + off, n, k)?;
            off += (n * k * 2) as u64;
        }
        anyhow::Ok(())
    };
    let time = |launch: &dyn Fn() -> anyhow::Result<()>| time_ms(&f.gpu, 2, 10, |_| launch());
    let flat_bytes = flat_n * FLAT_K * 2;
    let chain = Chain::new(&f.gpu, &mats, base, f.x.ptr())?;
    check_chain(&f, &chain, &mats)?;
    check_bulk(&f, &f.pair, &mats)?;
    check_bulk(&f, &f.scalar, &mats)?;
    // Alternated twice, so a drift of clocks shows as a difference between rounds.
    for _ in 0..2 {
        let ms = time(&|| f.ring(base, flat_n, FLAT_K, false))?;
        report(model, "ring, one launch", flat_bytes, 1, ms);
        let ms = time(&|| f.tight(&f.loads, base, flat_n, FLAT_K))?;
        report(model, "ring + loads, one launch", flat_bytes, 1, ms);
        let ms = time(&|| f.gemv(base, flat_n, FLAT_K))?;
        report(model, "gemv, one launch", flat_bytes, 1, ms);
        let ms = time(&|| f.tight(&f.scalar, base, flat_n, FLAT_K))?;
        report(model, "gemv scalar dots, one launch", flat_bytes, 1, ms);
        let ms = time(&|| per_matrix(&|w, n, k| f.ring(w, n, k, true)))?;
        report(model, "ring, per matrix (PDL)", total, mats.len(), ms);
        let ms = time(&|| per_matrix(&|w, n, k| f.ring(w, n, k, false)))?;
        report(model, "ring, per matrix (no PDL)", total, mats.len(), ms);
        let ms = time(&|| per_matrix(&|w, n, k| f.tight(&f.loads, w, n, k)))?;
        report(
            model,
            "ring + loads, per matrix (PDL)",
            total,
            mats.len(),
            ms,
        );
        let ms = time(&|| per_matrix(&|w, n, k| f.gemv(w, n, k)))?;
        report(model, "gemv, per matrix (PDL)", total, mats.len(), ms);
        let ms = time(&|| per_matrix(&|w, n, k| f.gemv_mode(w, n, k, GemvSmem::Tight)))?;
        report(
            model,
            "gemv, per matrix (PDL), tight",
            total,
            mats.len(),
            ms,
        );
        let ms = time(&|| per_matrix(&|w, n, k| f.gemv_mode(w, n, k, GemvSmem::Deep)))?;
        report(
            model,
            "gemv, per matrix (PDL), deep ring",
            total,
            mats.len(),
            ms,
        );
        let ms = time(&|| per_matrix(&|w, n, k| f.tight(&f.scalar, w, n, k)))?;
        report(
            model,
            "gemv scalar dots, per matrix (PDL), tight",
            total,
            mats.len(),
            ms,
        );
        let ms = time(&|| per_matrix(&|w, n, k| f.tight(&f.pair, w, n, k)))?;
        report(
            model,
            "gemv r16 x2 tight, per matrix (PDL)",
            total,
            mats.len(),
            ms,
        );
        let ms = time(&|| f.tight(&f.pair, base, flat_n, FLAT_K))?;
        report(model, "gemv r16 x2, one launch", flat_bytes, 1, ms);
        let ms = time(&|| chain.launch(&f.gpu, false))?;
        report(model, "chain, one launch (grid barriers)", total, 1, ms);
        let ms = time(&|| chain.launch(&f.gpu, true))?;
        let per = ms * 1e3 / (chain.count - 1) as f64;
        eprintln!(
            "stream floor {model} chain of {} one-stage ops: {ms:.3} ms, {per:.2} us an op and \
             barrier",
            chain.count
        );
        emit(
            json!({"figure": "chain_sync", "model": model, "ops": chain.count, "ms": ms,
            "us_per_barrier": per}),
        );
    }
    let copy = COPY_BYTES.min(total);
    let dst = f.gpu.alloc(copy)?;
    let ms = time(&|| {
        // SAFETY: both buffers hold at least `copy` bytes.
        unsafe { result::memcpy_dtod_async(dst.ptr(), base, copy, f.gpu.stream.cu_stream()) }?;
        Ok(())
    })?;
    report(model, "device copy (bytes read)", copy, 1, ms);
    for (variant, tight) in [("roomy", false), ("tight", true)] {
        let launch = |w, n, k, stamps| f.stamped(w, n, k, stamps, tight);
        boundary_stamps::run(&f.gpu, model, variant, &mats, base, &launch)?;
    }
    Ok(())
}

/// The chain's outputs (with its barriers) against the shipped gemv's, matrix by matrix: the
/// first layer's four, and the LM head.
fn check_chain(f: &Floor, chain: &Chain, mats: &[(usize, usize)]) -> anyhow::Result<()> {
    f.gpu.memset(chain.y.ptr(), 0xff, chain.y.bytes())?; // NaN poison
    chain.launch(&f.gpu, false)?;
    f.gpu.sync()?;
    let (mut w, mut yo) = (f.w.ptr(), 0usize);
    let mut worst = 0f64;
    for (j, &(n, k)) in mats.iter().enumerate() {
        if j < 4 || j + 1 == mats.len() {
            f.gemv(w, n, k)?;
            let want = read_bf16(&f.gpu, &f.y, n)?;
            let all = read_bf16(&f.gpu, &chain.y, yo + n)?;
            let err = rel_err(&all[yo..], &want);
            anyhow::ensure!(
                err < 2e-2,
                "gemv_chain matrix {j} ({n} x {k}): relative error {err}"
            );
            worst = worst.max(err);
        }
        w += (n * k * 2) as u64;
        yo += n;
    }
    eprintln!(
        "stream floor: gemv_chain matches the shipped gemv (worst relative error {worst:.2e})"
    );
    Ok(())
}

/// Build `b`'s outputs (launched tight) against the shipped gemv's for the first layer's four
/// matrices and the LM head, `y` poisoned before each.
fn check_bulk(f: &Floor, b: &Bulk, mats: &[(usize, usize)]) -> anyhow::Result<()> {
    let (mut w, mut worst) = (f.w.ptr(), 0f64);
    for (j, &(n, k)) in mats.iter().enumerate() {
        if j < 4 || j + 1 == mats.len() {
            f.gemv(w, n, k)?;
            let want = read_bf16(&f.gpu, &f.y, n)?;
            f.gpu.memset(f.y.ptr(), 0xff, n * 2)?; // NaN poison
            f.tight(b, w, n, k)?;
            let got = read_bf16(&f.gpu, &f.y, n)?;
            let err = rel_err(&got, &want);
            anyhow::ensure!(
                err < 1e-2,
                "{} stages: matrix {j} ({n} x {k}): relative error {err}",
                b.stages
            );
            worst = worst.max(err);
        }
        w += (n * k * 2) as u64;
    }
    eprintln!(
        "stream floor: the {}-stage tight build matches the shipped gemv (worst relative error \
         {worst:.2e})",
        b.stages
    );
    Ok(())
}
