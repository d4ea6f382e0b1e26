//! `gpu-bench overlap`: whether a large decode step gets faster when it is cut in two
//! nano-batches on two streams (NanoFlow-style), so that one nano-batch's compute-bound GEMMs run
//! beside the other's memory-bound attention, instead of the whole batch going through each
//! layer on one stream. Measured on the layer's four GEMMs (cuBLAS) and its decode attention
//! (brook's kernel), before any of it goes into the forward: at batch 512 a Llama-2-7B step is
//! about half of each (session 22's estimate: ~10.6 ms of GEMMs, ~11.4 ms of attention), one
//! after the other.
//!
//! Variants, each over all layers of the model, timed from one event to another after the host
//! has queued every launch (a spin kernel holds the GPU meanwhile, so host launch speed is not
//! measured):
//! - `one_stream`: the whole batch, layer by layer (what the forward does now);
//! - `gemms_only`, `attention_only`: its two halves alone;
//! - `nano_serial`: the two nano-batches one after the other on one stream (the cost of cutting
//!   the batch: GEMMs of half the rows are less efficient);
//! - `two_streams`: nano-batch 0 on the primary stream, 1 on a sibling (`Gpu::sibling`), each
//!   layer by layer; `_staggered`: nano-batch 1 starts after nano-batch 0's first QKV GEMM, so
//!   their GEMMs and attention alternate;
//! - `attention_high`: as `two_streams_staggered`, but both nano-batches' attention on one
//!   high-priority stream (events hand each layer between a nano-batch's GEMM stream and it);
//! - with `--sm-targets X,..`, for each X: `gemms_only_smX` (the whole batch's GEMMs with cuBLAS
//!   asked to use X SMs, `cublasSetSmCountTarget`) and `two_streams_smX` (as
//!   `two_streams_staggered`, each nano-batch's GEMMs on X SMs): whether GEMMs held to part of
//!   the GPU leave the rest to the other nano-batch's attention (session 24's plain two streams
//!   lost: each kind of kernel already fills every SM), and `attention_only_onX`: the whole
//!   batch's attention while a hog kernel holds all other SMs (`Spin::hog`): how much of the
//!   copy bandwidth X SMs pull, i.e. what the attention half of a partitioned GPU would get;
//! - with `--green X,..`, the GPU cut by green contexts (`GreenSplit`) into X SMs for GEMMs and
//!   the rest for attention: `gemms_only_greenX`, `attention_only_greenX` (the whole batch on
//!   its partition) and `two_streams_greenX` (as `two_streams_staggered`, each nano-batch's
//!   GEMMs on a stream of the first partition and its attention on one of the second), and
//!   `two_streams_greenX_values`, the same handing off by stream memory operations instead of
//!   events (events cross the two green contexts).
//!
//! Left out: the element-wise kernels (norms, RoPE, SwiGLU: a few % of such a step), the LM
//! head and sampling (once a step, not per layer).

use anyhow::Context;
use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::gemm::{self, Weight};
use brook::executor::cuda::kernels::{self, PagedDecodeParams};
use brook::executor::cuda::{decode_fill, DecodeKernel};
use brook::model::synthetic::synthetic_config;
use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{result, CudaEvent};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{
    bench_options, elapsed_ms, emit, median, open_gpu, random_bf16, upload, AttnShape,
};
use crate::green::GreenSplit;
use crate::spin::Spin;

pub struct Args<'a> {
    pub model: &'a str,
    /// Whole batches (each cut in two nano-batches of half the rows).
    pub batch: &'a [usize],
    /// Context of every sequence (keys each decode reads).
    pub context: &'a [usize],
    /// Layers per timed run (default: the model's).
    pub layers: Option<usize>,
    pub reps: usize,
    /// SM counts cuBLAS is asked to keep its GEMMs to, each a pair of variants.
    pub sm_targets: &'a [usize],
    /// SM counts of the GEMMs' green-context partition, each three variants.
    pub green: &'a [usize],
}

/// How long the hog holds its SMs: longer than the spin and any attention run on part of the GPU.
const HOG_NS: u64 = 150_000_000;

/// Caches the layers take turns on: each is far larger than L2, so two keep any layer from
/// reading what the one before left there.
const CACHE_SETS: usize = 2;
/// One layer's linear weights, `[n, k]` each.
struct LayerWeights {
    qkv: DevBuf,
    o: DevBuf,
    gate_up: DevBuf,
    down: DevBuf,
}

/// The model's shapes the layer body needs.
struct Dims {
    d: usize,
    qkv_n: usize,
    q_dim: usize,
    inter: usize,
    attn: AttnShape,
    kernel: DecodeKernel,
}

impl Dims {
    fn of(model: &str, gpu: &Gpu) -> anyhow::Result<Dims> {
        let c = synthetic_config(model)?;
        let attn = AttnShape::of_model(model)?;
        let kernel = kernels::decode_kernel(
            bench_options().decode_kernel,
            attn.head_dim,
            attn.heads / attn.kv_heads,
            gpu.kv_fp8(),
        );
        Ok(Dims {
            d: c.hidden_size,
            qkv_n: c.q_dim() + 2 * c.kv_dim(),
            q_dim: c.q_dim(),
            inter: c.intermediate_size,
            attn,
            kernel,
        })
    }

    fn group(&self) -> usize {
        self.attn.heads / self.attn.kv_heads
    }
}

/// The paged cache every run reads: `CACHE_SETS` pools, each holding `seqs` sequences of
/// `context` keys in blocks drawn at random.
struct Caches {
    k: Vec<DevBuf>,
    v: Vec<DevBuf>,
    /// Per set: `[seqs, blocks_per_seq]` block ids.
    tables: Vec<DevBuf>,
    blocks_per_seq: usize,
    context: usize,
}

impl Caches {
    fn new(gpu: &Gpu, dims: &Dims, seqs: usize, context: usize) -> anyhow::Result<Caches> {
        let blocks_per_seq = context.div_ceil(dims.attn.block_size);
        let num_blocks = seqs * blocks_per_seq;
        let elems = num_blocks * dims.attn.kv_heads * dims.attn.block_size * dims.attn.head_dim;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut c = Caches {
            k: Vec::new(),
            v: Vec::new(),
            tables: Vec::new(),
            blocks_per_seq,
            context,
        };
        for set in 0..CACHE_SETS as u64 {
            c.k.push(random_bf16(gpu, elems, 100 + set)?);
            c.v.push(random_bf16(gpu, elems, 200 + set)?);
            let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
            perm.shuffle(&mut rng);
            c.tables.push(upload(gpu, &perm)?);
        }
        Ok(c)
    }
}

/// One batch (or nano-batch) of `rows` sequences from sequence `first` of the caches on: its
/// activations, its attention's inputs, and the streams its GEMMs and its attention run on.
struct Lane<'g> {
    gemm: &'g Gpu,
    attn: &'g Gpu,
    rows: usize,
    first: usize,
    splits: usize,
    x: DevBuf,
    qkv: DevBuf,
    q: DevBuf,
    attn_out: DevBuf,
    gate_up: DevBuf,
    act: DevBuf,
    y: DevBuf,
    item_row: DevBuf,
    ctx_lens: DevBuf,
    part_acc: DevBuf,
    part_ml: DevBuf,
    counters: DevBuf,
    /// Hand-offs between `gemm` and `attn` when they differ: events, or with `by_value` a
    /// counter each way in device memory (`flags`, [2] u32), written by one stream and waited
    /// on by the other (stream memory operations: no event, so no cross-context event wait
    /// between green contexts); `sent` counts the hand-offs each way.
    to_attn: CudaEvent,
    to_gemm: CudaEvent,
    by_value: bool,
    flags: Flags,
    sent: [std::cell::Cell<u32>; 2],
}

/// Two u32 counters in device memory from `cuMemAlloc` (stream memory operations refused a
/// stream-ordered pool allocation with CUDA_ERROR_INVALID_VALUE: call 7).
struct Flags(sys::CUdeviceptr);

impl Flags {
    fn new(gpu: &Gpu) -> anyhow::Result<Flags> {
        gpu.ctx.bind_to_thread()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: an 8-byte allocation, zeroed before any use, freed on drop.
        unsafe {
            let r = sys::cuMemAlloc_v2(&mut p, 8);
            anyhow::ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuMemAlloc: {r:?}");
            let r = sys::cuMemsetD32_v2(p, 0, 2);
            anyhow::ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuMemsetD32: {r:?}");
        }
        Ok(Flags(p))
    }

    fn ptr(&self) -> sys::CUdeviceptr {
        self.0
    }
}

impl Drop for Flags {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once, after every stream that used it has finished
        // (each run ends by synchronizing).
        unsafe { sys::cuMemFree_v2(self.0) };
    }
}

impl<'g> Lane<'g> {
    #[allow(clippy::too_many_arguments)] // what the lane is: two streams, its rows and its dims
    fn new(
        gemm: &'g Gpu,
        attn: &'g Gpu,
        dims: &Dims,
        caches: &Caches,
        rows: usize,
        first: usize,
    ) -> anyhow::Result<Lane<'g>> {
        let g = gemm;
        let fill = decode_fill(
            &bench_options(),
            dims.attn.head_dim,
            dims.group(),
            g.kv_fp8(),
        );
        let splits = match fill {
            0 => kernels::decode_splits(g.num_sms, rows, dims.attn.kv_heads, caches.context),
            c => kernels::decode_splits_filled(
                g.num_sms,
                c,
                rows,
                dims.attn.kv_heads,
                dims.group(),
                caches.context,
                kernels::decode_min_split_keys(dims.kernel, caches.context),
            ),
        };
        let counters_n =
            rows * dims.attn.kv_heads * kernels::decode_group_ctas_for(dims.group(), g.kv_fp8());
        let counters = g.alloc(counters_n * 4)?;
        g.memset(counters.ptr(), 0, counters_n * 4)?;
        let flags = Flags::new(g)?;
        let row_ids: Vec<i32> = (0..rows as i32).collect();
        let event = || {
            g.ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        };
        Ok(Lane {
            gemm,
            attn,
            rows,
            first,
            splits,
            x: random_bf16(g, rows * dims.d, 1)?,
            qkv: g.alloc(rows * dims.qkv_n * 2)?,
            q: random_bf16(g, rows * dims.q_dim, 2)?,
            attn_out: random_bf16(g, rows * dims.q_dim, 3)?,
            gate_up: g.alloc(rows * 2 * dims.inter * 2)?,
            act: random_bf16(g, rows * dims.inter, 4)?,
            y: g.alloc(rows * dims.d * 2)?,
            item_row: upload(g, &row_ids)?,
            ctx_lens: upload(g, &vec![caches.context as i32; rows])?,
            part_acc: g.alloc((rows * dims.attn.heads * splits * dims.attn.head_dim * 4).max(4))?,
            part_ml: g.alloc((rows * dims.attn.heads * splits * 2 * 4).max(4))?,
            counters,
            to_attn: event()?,
            to_gemm: event()?,
            by_value: false,
            flags,
            sent: Default::default(),
        })
    }

    /// Orders `to`'s next work after `from`'s so far: `event`, or counter `way` of `flags`.
    fn hand_off(&self, from: &Gpu, to: &Gpu, event: &CudaEvent, way: usize) -> anyhow::Result<()> {
        if !self.by_value {
            event.record(&from.stream)?;
            return Ok(to.stream.wait(event)?);
        }
        let n = self.sent[way].get() + 1;
        self.sent[way].set(n);
        let addr = self.flags.ptr() + 4 * way as u64;
        // SAFETY: addr is this lane's flags buffer (8 bytes, live as long as the lane).
        unsafe {
            let w = sys::cuStreamWriteValue32_v2(from.stream.cu_stream(), addr, n, 0);
            anyhow::ensure!(
                w == sys::CUresult::CUDA_SUCCESS,
                "cuStreamWriteValue32: {w:?}"
            );
            // CU_STREAM_WAIT_VALUE_GEQ (0): until the counter reaches this hand-off.
            let r = sys::cuStreamWaitValue32_v2(to.stream.cu_stream(), addr, n, 0);
            anyhow::ensure!(
                r == sys::CUresult::CUDA_SUCCESS,
                "cuStreamWaitValue32: {r:?}"
            );
        }
        Ok(())
    }

    fn split_streams(&self) -> bool {
        !std::ptr::eq(self.gemm, self.attn)
    }

    /// y = x · wᵀ on the lane's GEMM stream.
    fn linear(&self, x: &DevBuf, w: &DevBuf, y: &DevBuf, n: usize, k: usize) -> anyhow::Result<()> {
        // SAFETY: x is [rows, k], w [n, k] and y [rows, n] bf16 (allocated so in `new`).
        unsafe {
            gemm::linear(
                self.gemm,
                None,
                x.ptr(),
                Weight::bf16(w.ptr()),
                y.ptr(),
                self.rows,
                n,
                k,
                false,
            )
        }
    }

    fn attention(&self, dims: &Dims, caches: &Caches, set: usize) -> anyhow::Result<()> {
        let table = caches.tables[set].ptr() + (self.first * caches.blocks_per_seq * 4) as u64;
        let p = PagedDecodeParams {
            q: self.q.ptr(),
            k_cache: caches.k[set].ptr(),
            v_cache: caches.v[set].ptr(),
            item_row: self.item_row.ptr(),
            item_seq: self.item_row.ptr(),
            block_tables: table,
            context_lens: self.ctx_lens.ptr(),
            out: self.attn_out.ptr(),
            part_acc: self.part_acc.ptr(),
            part_ml: self.part_ml.ptr(),
            counters: if self.splits > 1 {
                self.counters.ptr()
            } else {
                0
            },
            num_items: self.rows as i32,
            num_heads: dims.attn.heads as i32,
            num_kv_heads: dims.attn.kv_heads as i32,
            block_size: dims.attn.block_size as i32,
            max_blocks: caches.blocks_per_seq as i32,
            num_splits: self.splits as i32,
            window: 0,
            scale: dims.attn.scale(),
        };
        // SAFETY: the lane's rows index `rows` sequences of `blocks_per_seq` blocks from
        // `first` on, inside the set's table; q and out are [rows, heads, head_dim]; the split
        // scratch and counters are sized for `splits` (counters zero: the kernel leaves them so).
        unsafe { kernels::paged_decode(self.attn, &p, dims.attn.head_dim, dims.kernel, false) }
    }

    /// One layer: QKV, attention, o, gate|up, down (the element-wise kernels left out);
    /// `after_qkv` is recorded on the GEMM stream after the QKV GEMM.
    fn layer(
        &self,
        run: &Run,
        w: &LayerWeights,
        set: usize,
        after_qkv: Option<&CudaEvent>,
    ) -> anyhow::Result<()> {
        let d = run.dims;
        if run.gemms {
            self.linear(&self.x, &w.qkv, &self.qkv, d.qkv_n, d.d)?;
        }
        if let Some(e) = after_qkv {
            e.record(&self.gemm.stream)?;
        }
        if self.split_streams() {
            self.hand_off(self.gemm, self.attn, &self.to_attn, 0)?;
        }
        if run.attention {
            self.attention(d, run.caches, set)?;
        }
        if self.split_streams() {
            self.hand_off(self.attn, self.gemm, &self.to_gemm, 1)?;
        }
        if run.gemms {
            self.linear(&self.attn_out, &w.o, &self.y, d.d, d.q_dim)?;
            self.linear(&self.x, &w.gate_up, &self.gate_up, 2 * d.inter, d.d)?;
            self.linear(&self.act, &w.down, &self.y, d.d, d.inter)?;
        }
        Ok(())
    }
}

/// `lane` moved onto other handles (its buffers stay where they were allocated).
fn on<'g>(mut lane: Lane<'g>, gemm: &'g Gpu, attn: &'g Gpu) -> Lane<'g> {
    lane.gemm = gemm;
    lane.attn = attn;
    lane
}

/// `lane` handing off between its streams by stream memory operations (`Lane::hand_off`).
fn by_value(mut lane: Lane<'_>) -> Lane<'_> {
    lane.by_value = true;
    lane
}

/// What one timed run enqueues.
struct Run<'a> {
    dims: &'a Dims,
    caches: &'a Caches,
    weights: &'a [LayerWeights],
    gemms: bool,
    attention: bool,
    /// The second lane starts after the first lane's first QKV GEMM.
    stagger: bool,
    /// SMs left to the run: a hog kernel holds the others (on its own stream) meanwhile.
    only_sms: Option<u32>,
}

/// The events and the spin kernel every timed run uses (on the primary stream).
struct Timer {
    spin: Spin,
    start: CudaEvent,
    end: CudaEvent,
    stagger: CudaEvent,
    joins: Vec<CudaEvent>,
}

impl Timer {
    fn new(gpu: &Gpu) -> anyhow::Result<Timer> {
        let spin = Spin::new(gpu)?;
        let timed = || gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        let plain = || {
            gpu.ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        };
        Ok(Timer {
            spin,
            start: timed()?,
            end: timed()?,
            stagger: plain()?,
            joins: (0..4).map(|_| plain()).collect::<Result<_, _>>()?,
        })
    }

    /// One run of `lanes` (the first lane's GEMM stream is the primary): GPU ms from the first
    /// launch to the last one's end, and the host's queueing time (ms).
    fn time(
        &self,
        primary: &Gpu,
        hog: &Gpu,
        lanes: &[Lane],
        run: &Run,
    ) -> anyhow::Result<(f64, f64)> {
        if let Some(sms) = run.only_sms {
            let held = primary.num_sms.saturating_sub(sms).max(1);
            self.spin.hog(hog, held, HOG_NS)?;
        }
        self.spin.hold(primary)?;
        let queued = std::time::Instant::now();
        self.start.record(&primary.stream)?;
        let mut others: Vec<&Gpu> = Vec::new();
        for lane in lanes {
            for g in [lane.gemm, lane.attn] {
                if !std::ptr::eq(g, primary) && !others.iter().any(|o| std::ptr::eq(*o, g)) {
                    others.push(g);
                }
            }
        }
        anyhow::ensure!(others.len() <= self.joins.len(), "too many streams");
        for g in &others {
            g.stream.wait(&self.start)?;
        }
        for (l, w) in run.weights.iter().enumerate() {
            let set = l % CACHE_SETS;
            for (i, lane) in lanes.iter().enumerate() {
                let first = l == 0 && run.stagger;
                if first && i == 1 {
                    lane.gemm.stream.wait(&self.stagger)?;
                }
                let mark = (first && i == 0).then_some(&self.stagger);
                lane.layer(run, w, set, mark)?;
            }
        }
        for (g, join) in others.iter().zip(&self.joins) {
            join.record(&g.stream)?;
            primary.stream.wait(join)?;
        }
        self.end.record(&primary.stream)?;
        let queue_ms = elapsed_ms(queued);
        self.end.synchronize()?;
        if run.only_sms.is_some() {
            hog.sync()?; // the next run starts with the GPU whole
        }
        Ok((self.start.elapsed_ms(&self.end)? as f64, queue_ms))
    }
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    let cfg = synthetic_config(a.model)?;
    let mut gpu = open_gpu()?;
    gpu.load_attention(
        cfg.head_dim,
        cfg.num_attention_heads / cfg.num_key_value_heads,
    )?;
    let dims = Dims::of(a.model, &gpu)?;
    let (_, highest) = result::stream::get_priority_range()?;
    let (sib, high) = (gpu.sibling(None)?, gpu.sibling(Some(highest))?);
    let layers = a.layers.unwrap_or(cfg.num_hidden_layers);
    eprintln!(
        "overlap {}: allocating {layers} layers of weights ({:.1} GB)",
        a.model,
        (layers * (dims.qkv_n * dims.d + dims.d * dims.q_dim + 3 * dims.inter * dims.d) * 2) as f64
            / 1e9
    );
    let weights = (0..layers as u64)
        .map(|l| {
            Ok(LayerWeights {
                qkv: random_bf16(&gpu, dims.qkv_n * dims.d, 10 * l + 1)?,
                o: random_bf16(&gpu, dims.d * dims.q_dim, 10 * l + 2)?,
                gate_up: random_bf16(&gpu, 2 * dims.inter * dims.d, 10 * l + 3)?,
                down: random_bf16(&gpu, dims.d * dims.inter, 10 * l + 4)?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Per SM target: two sibling streams whose cuBLAS handles aim at that many SMs.
    let limited = a
        .sm_targets
        .iter()
        .map(|&sms| {
            let pair = (gpu.sibling(None)?, gpu.sibling(None)?);
            for g in [&pair.0, &pair.1] {
                // SAFETY: the handle is live (owned by `g`); the target only sizes later GEMMs.
                unsafe { cublas_sys::cublasSetSmCountTarget(*g.blas.handle(), sms as i32) }
                    .result()
                    .with_context(|| format!("cublasSetSmCountTarget({sms})"))?;
            }
            Ok((sms, pair))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Per green split: two GEMM handles on its first partition, two attention handles on its
    // second, then the split (a tuple drops its fields in order: the handles before the
    // contexts they run on).
    let splits = a
        .green
        .iter()
        .map(|&sms| {
            let split = GreenSplit::new(&gpu, sms as u32)?;
            eprintln!("overlap: green split of {sms} SMs: {:?}", split.sms);
            let g = [split.gpu(&gpu, 0)?, split.gpu(&gpu, 0)?];
            let at = [split.gpu(&gpu, 1)?, split.gpu(&gpu, 1)?];
            Ok((g, at, split))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let timer = Timer::new(&gpu)?;
    let hog = gpu.sibling(None)?;
    for &batch in a.batch {
        anyhow::ensure!(
            batch >= 2 && batch % 2 == 0,
            "batch {batch}: an even number of rows"
        );
        let nano = batch / 2;
        for &context in a.context {
            let caches = Caches::new(&gpu, &dims, batch, context)
                .with_context(|| format!("caches for {batch} x {context}"))?;
            let whole = [Lane::new(&gpu, &gpu, &dims, &caches, batch, 0)?];
            let serial = [
                Lane::new(&gpu, &gpu, &dims, &caches, nano, 0)?,
                Lane::new(&gpu, &gpu, &dims, &caches, nano, nano)?,
            ];
            let two = [
                Lane::new(&gpu, &gpu, &dims, &caches, nano, 0)?,
                Lane::new(&sib, &sib, &dims, &caches, nano, nano)?,
            ];
            let hi = [
                Lane::new(&gpu, &high, &dims, &caches, nano, 0)?,
                Lane::new(&sib, &high, &dims, &caches, nano, nano)?,
            ];
            let mut held = Vec::new();
            for (sms, (ga, gb)) in &limited {
                held.push((
                    *sms,
                    [Lane::new(ga, ga, &dims, &caches, batch, 0)?],
                    [
                        Lane::new(ga, ga, &dims, &caches, nano, 0)?,
                        Lane::new(gb, gb, &dims, &caches, nano, nano)?,
                    ],
                ));
            }
            // Lanes allocate through the primary handle, then run on a green split's handles.
            let mut greens = Vec::new();
            for (g, at, split) in &splits {
                let lane = |rows, first| Lane::new(&gpu, &gpu, &dims, &caches, rows, first);
                greens.push((
                    split.sms[0],
                    [on(lane(batch, 0)?, &g[0], &g[0])],
                    [on(lane(batch, 0)?, &at[0], &at[0])],
                    [
                        on(lane(nano, 0)?, &g[0], &at[0]),
                        on(lane(nano, nano)?, &g[1], &at[1]),
                    ],
                    [
                        by_value(on(lane(nano, 0)?, &g[0], &at[0])),
                        by_value(on(lane(nano, nano)?, &g[1], &at[1])),
                    ],
                ));
            }
            for g in [&gpu, &sib, &high]
                .into_iter()
                .chain(limited.iter().flat_map(|(_, (a, b))| [a, b]))
                .chain(splits.iter().flat_map(|(g, at, _)| g.iter().chain(at)))
            {
                g.sync()?;
            }
            let plan = |gemms, attention, stagger| Run {
                dims: &dims,
                caches: &caches,
                weights: &weights,
                gemms,
                attention,
                stagger,
                only_sms: None,
            };
            let mut variants: Vec<(String, &[Lane], Run)> = vec![
                ("one_stream".into(), &whole, plan(true, true, false)),
                ("gemms_only".into(), &whole, plan(true, false, false)),
                ("attention_only".into(), &whole, plan(false, true, false)),
                ("nano_serial".into(), &serial, plan(true, true, false)),
                ("two_streams".into(), &two, plan(true, true, false)),
                ("two_streams_staggered".into(), &two, plan(true, true, true)),
                ("attention_high".into(), &hi, plan(true, true, true)),
            ];
            for (sms, whole_sm, two_sm) in &held {
                let only = Run {
                    only_sms: Some(*sms as u32),
                    ..plan(false, true, false)
                };
                variants.extend([
                    (
                        format!("gemms_only_sm{sms}"),
                        &whole_sm[..],
                        plan(true, false, false),
                    ),
                    (
                        format!("two_streams_sm{sms}"),
                        &two_sm[..],
                        plan(true, true, true),
                    ),
                    (format!("attention_only_on{sms}"), &whole[..], only),
                ]);
            }
            for (sms, gemm_lane, attn_lane, two_green, two_values) in &greens {
                variants.extend([
                    (
                        format!("gemms_only_green{sms}"),
                        &gemm_lane[..],
                        plan(true, false, false),
                    ),
                    (
                        format!("attention_only_green{sms}"),
                        &attn_lane[..],
                        plan(false, true, false),
                    ),
                    (
                        format!("two_streams_green{sms}"),
                        &two_green[..],
                        plan(true, true, true),
                    ),
                    (
                        format!("two_streams_green{sms}_values"),
                        &two_values[..],
                        plan(true, true, true),
                    ),
                ]);
            }
            let mut one = 0.0;
            let mut best = f64::INFINITY;
            for (name, lanes, run) in &variants {
                let mut times = Vec::new();
                let mut queue = Vec::new();
                for rep in 0..a.reps + 2 {
                    let (ms, q) = timer.time(&gpu, &hog, lanes, run)?;
                    if rep >= 2 {
                        times.push(ms);
                        queue.push(q);
                    }
                }
                let (ms, queue_ms) = (median(times), median(queue));
                if *name == "one_stream" {
                    one = ms;
                } else if name.starts_with("two") || name.starts_with("attention_high") {
                    best = best.min(ms);
                }
                let starved = Spin::starved(queue_ms);
                eprintln!(
                    "overlap {} batch {batch} ctx {context} {name:<22}: {ms:.3} ms ({:.1} us a layer), queued in {queue_ms:.2} ms{}",
                    a.model,
                    ms * 1e3 / layers as f64,
                    if starved { " (longer than the spin: the GPU waited for the host)" } else { "" }
                );
                emit(
                    json!({"figure": "overlap", "model": a.model, "batch": batch, "nano_batch": nano, "ctx": context, "layers": layers, "variant": name, "ms": ms, "us_per_layer": ms * 1e3 / layers as f64, "queue_ms": queue_ms, "host_starved": starved, "splits": lanes[0].splits, "decode_kernel": dims.kernel.as_str(), "reps": a.reps}),
                );
            }
            eprintln!(
                "overlap {} batch {batch} ctx {context}: best two-stream run {:.3}x one stream",
                a.model,
                one / best
            );
            emit(
                json!({"figure": "overlap_speedup", "model": a.model, "batch": batch, "ctx": context, "one_stream_ms": one, "best_two_stream_ms": best, "speedup": one / best}),
            );
        }
    }
    Ok(())
}
