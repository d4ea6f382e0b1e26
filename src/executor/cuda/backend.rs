//! `CudaBackend`: the Llama forward on the GPU for one flattened paged batch.
//!
//! Per step the host packs the batch's integer metadata (tokens, positions, slots, per-sequence
//! lengths and block tables, decode items, prefill tiles, sampled rows) into one buffer and
//! uploads it with one copy; the forward is then a fixed chain of launches on one stream:
//!
//! ```text
//! embedding → per layer: add+RMSNorm → QKV GEMM → RoPE + KV write → decode attention (q_len 1)
//!   and/or prefill attention (q_len > 1) → O GEMM → add+RMSNorm → gate|up GEMM → SiLU×up
//!   → down GEMM; then add+RMSNorm at sampled rows only → lm_head GEMM (fp32 logits) → sampling
//! ```
//!
//! Prefill attention takes two paths: sequences whose context is at most
//! `prefill_gemm_max_len` keys go through cuBLAS (`prefill_gemm`), the rest through the flash
//! kernel, whose tiles then cover only those. Both may serve one step.
//!
//! Steps that are pure decode are padded to a batch-size bucket and replayed from a CUDA graph
//! captured on the bucket's first use: the metadata buffer's layout depends only on the bucket,
//! so the graph's pointers stay valid and each replay only needs the metadata copy before it.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use super::device::{DevBuf, Gpu};
use super::gemm::linear;
use super::kernels::{self, *};
use super::prefill_gemm::{self, GemmAttention, GemmPlanner, GemmScratch, GemmSeq};
use super::weights::GpuWeights;
use crate::executor::backend::{Backend, BackendInfo};
use crate::model::config::ModelConfig;
use crate::model::loader::ModelWeights;
use crate::step::{BatchInput, SampledToken, StepOutput};

#[derive(Debug, Clone)]
pub struct CudaBackendOptions {
    pub device_ordinal: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Fraction of the GPU's memory for weights, activations and the KV pool.
    pub gpu_memory_utilization: f64,
    /// Caps the KV pool below what `gpu_memory_utilization` allows (tests, co-located runs).
    pub max_kv_cache_bytes: Option<usize>,
    /// Activations are sized for this many tokens per step (the scheduler's token budget).
    pub max_num_batched_tokens: usize,
    /// Most sequences per step (the scheduler's `max_num_seqs`).
    pub max_num_seqs: usize,
    /// Longest sequence: the width of the block tables. 0: the model's max_position_embeddings.
    pub max_model_len: usize,
    /// Replay pure-decode steps from CUDA graphs.
    pub cuda_graphs: bool,
    /// Linear layers of at most this many rows run on brook's `gemv` kernel instead of cuBLAS
    /// (0: always cuBLAS; at most `kernels::GEMV_MAX_M`).
    pub gemv_max_rows: usize,
    /// Warps per output row of every gemv (1, 2, 4 or 8); 0 (default): chosen per shape by
    /// `kernels::gemv_split`. For benchmarks.
    pub gemv_split: usize,
    /// On the gemv path, fuse RoPE + the K/V write into the QKV projection and SiLU × up into
    /// the gate|up projection (two launches fewer per layer). Off by default: on the H200 the
    /// fused kernels measured 0.17 ms/token slower at batch 1 (BENCHMARKS.md, call f).
    pub fuse_decode: bool,
    /// Programmatic dependent launch where the GPU has it (sm_90+): GEMVs and norms start while
    /// the kernel before them drains, streaming their weights early.
    pub pdl: bool,
    /// Prefill sequences whose context (cached prefix + chunk) has at most this many tokens run
    /// attention as cuBLAS GEMMs with a causal softmax kernel; longer ones on the flash kernel
    /// (0: flash only). Its scratch is sized at start; a step's GEMM sequences that do not fit
    /// it go to the flash kernel. The crossover is measured by `gpu-bench prefill-attn`.
    pub prefill_gemm_max_len: usize,
    pub progress: bool,
    /// gpu-bench only: kinds of launch left out of each layer (`skip::*` bits), to time what
    /// each costs inside a decode step; the step's output is then meaningless. 0 otherwise.
    pub skip: u32,
}

/// Bits of `CudaBackendOptions::skip`.
pub mod skip {
    pub const NORMS: u32 = 1;
    pub const ROPE: u32 = 2;
    pub const ATTENTION: u32 = 4;
    pub const SILU: u32 = 8;
    /// The layers' linear projections (not the LM head).
    pub const LINEAR: u32 = 16;
}

impl Default for CudaBackendOptions {
    fn default() -> Self {
        CudaBackendOptions {
            device_ordinal: 0,
            block_size: 16,
            gpu_memory_utilization: 0.90,
            max_kv_cache_bytes: None,
            max_num_batched_tokens: 2048,
            max_num_seqs: 64,
            max_model_len: 0,
            cuda_graphs: true,
            gemv_max_rows: GEMV_MAX_M,
            gemv_split: 0,
            fuse_decode: false,
            pdl: true,
            prefill_gemm_max_len: 0,
            progress: true,
            skip: 0,
        }
    }
}

/// Batch sizes decode graphs are captured for; a step is padded up to the next one.
const GRAPH_BUCKETS: &[usize] = &[
    1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512,
];

/// Kept free beyond the weights, activations and KV pool: cuBLAS, graphs, fragmentation.
const RESERVE_BYTES: usize = 1 << 30;

/// Offsets (in u32 words) of the metadata sections; a function of the step's counts only.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Layout {
    tokens: usize,
    positions: usize,
    slots: usize,
    ctx: usize,
    q_start: usize,
    q_len: usize,
    dec_row: usize,
    dec_seq: usize,
    tile_seq: usize,
    tile_q0: usize,
    gemm_seq: usize,
    gemm_key0: usize,
    gemm_s0: usize,
    sample_rows: usize,
    block_tables: usize,
    total: usize,
}

impl Layout {
    /// Sections for `t` tokens, `s` sequences, `nd` decode items, `nt` flash tiles, `ng` GEMM-path
    /// sequences and `ns` sampled rows.
    fn new(
        t: usize,
        s: usize,
        nd: usize,
        nt: usize,
        ng: usize,
        ns: usize,
        max_blocks: usize,
    ) -> Layout {
        let mut at = 0;
        let mut take = |n: usize| {
            let o = at;
            at += n;
            o
        };
        let mut l = Layout {
            tokens: take(t),
            positions: take(t),
            slots: take(t),
            ctx: take(s),
            q_start: take(s),
            q_len: take(s),
            dec_row: take(nd),
            dec_seq: take(nd),
            tile_seq: take(nt),
            tile_q0: take(nt),
            gemm_seq: take(ng),
            gemm_key0: take(ng),
            gemm_s0: take(ng),
            sample_rows: take(ns),
            block_tables: take(s * max_blocks),
            total: 0,
        };
        l.total = at;
        l
    }
}

/// One step's shape and its packed metadata.
#[derive(Debug, Clone)]
struct Step {
    t: usize,
    nd: usize,
    nt: usize,
    ns: usize,
    max_blocks: usize,
    splits: usize,
    /// Prefill sequences on the GEMM path, with their scratch offsets.
    gemm: Vec<GemmSeq>,
    layout: Layout,
    meta: Vec<u32>,
    args: Vec<SampleArgs>,
}

struct Activations {
    residual: DevBuf,
    xn: DevBuf,
    qkv: DevBuf,
    q: DevBuf,
    attn: DevBuf,
    delta: DevBuf,
    gate_up: DevBuf,
    act: DevBuf,
    head_in: DevBuf,
    logits: DevBuf,
    part_acc: DevBuf,
    part_ml: DevBuf,
    meta: DevBuf,
    args: DevBuf,
    out_tokens: DevBuf,
    out_logprobs: DevBuf,
}

/// A captured decode step. CUDA graphs may be used from one thread at a time; the backend owns
/// its graphs and is itself used by one thread at a time (it is moved, never shared).
struct DecodeGraph(CudaGraph);
// SAFETY: see above; the graph is only launched by the backend's owner.
unsafe impl Send for DecodeGraph {}

pub struct CudaBackend {
    cfg: ModelConfig,
    opts: CudaBackendOptions,
    weights: GpuWeights,
    act: Activations,
    inv_freq: DevBuf,
    /// K and V of all layers: layer l's K at kv_base + 2 l · layer_bytes, its V after it.
    kv: DevBuf,
    kv_layer_bytes: usize,
    num_blocks: usize,
    max_blocks: usize,
    max_tokens: usize,
    max_seqs: usize,
    /// GEMM prefill path: its context limit (at most the longest context), scratch and the
    /// scratch's capacities (key rows, score floats); no scratch when off.
    gemm_max_len: usize,
    gemm_scratch: Option<GemmScratch>,
    gemm_keys: usize,
    gemm_scores: usize,
    /// Keyed by (batch bucket, decode splits): the split count is baked into the launches.
    graphs: HashMap<(usize, usize), DecodeGraph>,
    // Host scratch reused across steps.
    tokens_host: Vec<i32>,
    logprobs_host: Vec<f32>,
    // Declared last: dropped after every buffer above.
    gpu: Gpu,
}

const MAX_SPLITS: usize = 32;

impl CudaBackend {
    /// Loads the Hugging Face model folder `dir`, streaming its tensors to the GPU as bf16.
    pub fn load(dir: &Path, opts: CudaBackendOptions) -> anyhow::Result<Self> {
        let cfg = ModelConfig::from_dir(dir)?;
        let gpu = Gpu::open(opts.device_ordinal)?;
        check_supported(&cfg)?;
        let w = GpuWeights::load(&gpu, &cfg, dir, opts.progress)?;
        Self::new(gpu, cfg, w, opts)
    }

    /// From weights already in memory (tests).
    pub fn from_weights(
        cfg: ModelConfig,
        weights: &ModelWeights,
        opts: CudaBackendOptions,
    ) -> anyhow::Result<Self> {
        let gpu = Gpu::open(opts.device_ordinal)?;
        check_supported(&cfg)?;
        let w = GpuWeights::upload(&gpu, &cfg, weights, opts.progress)?;
        Self::new(gpu, cfg, w, opts)
    }

    /// Random weights of `cfg`'s shapes, generated on the GPU (synthetic benchmarks).
    pub fn synthetic(
        cfg: ModelConfig,
        seed: u64,
        opts: CudaBackendOptions,
    ) -> anyhow::Result<Self> {
        let gpu = Gpu::open(opts.device_ordinal)?;
        check_supported(&cfg)?;
        let w = GpuWeights::random(&gpu, &cfg, seed)?;
        Self::new(gpu, cfg, w, opts)
    }

    fn new(
        mut gpu: Gpu,
        cfg: ModelConfig,
        weights: GpuWeights,
        opts: CudaBackendOptions,
    ) -> anyhow::Result<Self> {
        gpu.gemv_max_m = opts.gemv_max_rows.min(GEMV_MAX_M);
        gpu.gemv_split = opts.gemv_split;
        gpu.pdl &= opts.pdl;
        anyhow::ensure!(
            opts.block_size > 0
                && opts.max_num_seqs > 0
                && opts.max_num_batched_tokens >= opts.max_num_seqs,
            "invalid CUDA backend options {opts:?}"
        );
        let max_model_len = if opts.max_model_len == 0 {
            cfg.max_position_embeddings
        } else {
            opts.max_model_len
        };
        let max_blocks = max_model_len.div_ceil(opts.block_size);
        let max_seqs = opts.max_num_seqs;
        let max_tokens = opts.max_num_batched_tokens;
        let (d, hd, h) = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads);
        let qkv_dim = cfg.q_dim() + 2 * cfg.kv_dim();
        let max_tiles = max_tokens / PREFILL_TILE + max_seqs;
        let meta_words = Layout::new(
            max_tokens, max_seqs, max_seqs, max_tiles, max_seqs, max_seqs, max_blocks,
        )
        .total;
        let (bf, f4) = (2usize, 4usize);
        let act = Activations {
            residual: gpu.alloc(max_tokens * d * f4)?,
            xn: gpu.alloc(max_tokens * d * bf)?,
            // fp32: the GEMM outputs that RoPE and SiLU × up read (see rope_kv.cu).
            qkv: gpu.alloc(max_tokens * qkv_dim * f4)?,
            q: gpu.alloc(max_tokens * cfg.q_dim() * bf)?,
            attn: gpu.alloc(max_tokens * cfg.q_dim() * bf)?,
            delta: gpu.alloc(max_tokens * d * bf)?,
            gate_up: gpu.alloc(max_tokens * 2 * cfg.intermediate_size * f4)?,
            act: gpu.alloc(max_tokens * cfg.intermediate_size * bf)?,
            head_in: gpu.alloc(max_seqs * d * bf)?,
            logits: gpu.alloc(max_seqs * cfg.vocab_size * f4)?,
            part_acc: gpu.alloc(max_seqs * h * MAX_SPLITS * hd * f4)?,
            part_ml: gpu.alloc(max_seqs * h * MAX_SPLITS * 2 * f4)?,
            meta: gpu.alloc(meta_words * 4)?,
            args: gpu.alloc(max_seqs * std::mem::size_of::<SampleArgs>())?,
            out_tokens: gpu.alloc(max_seqs * 4)?,
            out_logprobs: gpu.alloc(max_seqs * 4)?,
        };
        let inv: Vec<f32> = cfg
            .rope
            .inv_freqs(hd)
            .into_iter()
            .map(|f| f as f32)
            .collect();
        let inv_freq = gpu.alloc(inv.len() * 4)?;
        gpu.upload(inv_freq.ptr(), &inv)?;
        let gemm_max_len = opts.prefill_gemm_max_len.min(max_blocks * opts.block_size);
        let (gemm_keys, gemm_scores) =
            prefill_gemm::scratch_capacity(gemm_max_len, max_tokens, max_seqs, h);
        let gemm_scratch = match gemm_keys {
            0 => None,
            _ => Some(GemmScratch::alloc(&gpu, gemm_keys, gemm_scores, h, hd)?),
        };
        gpu.sync()?;

        // The KV pool takes what the utilisation target leaves after everything above.
        let bytes_per_block = kv_bytes_per_block(&cfg, opts.block_size);
        let (free, total) = gpu.mem_info()?;
        let used = total - free;
        let target = (total as f64 * opts.gpu_memory_utilization) as usize;
        let mut kv_bytes = target.saturating_sub(used + RESERVE_BYTES);
        if let Some(cap) = opts.max_kv_cache_bytes {
            kv_bytes = kv_bytes.min(cap);
        }
        let num_blocks = kv_bytes / bytes_per_block;
        anyhow::ensure!(
            num_blocks > 0,
            "no room for the KV cache: {:.1} GiB of {:.1} GiB in use after weights and activations, gpu_memory_utilization {}",
            used as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64,
            opts.gpu_memory_utilization
        );
        let kv = gpu.alloc(num_blocks * bytes_per_block)?;
        let kv_layer_bytes = num_blocks * bytes_per_block / (2 * cfg.num_hidden_layers);
        tracing::info!(
            "CUDA backend on {}: weights {:.2} GiB, KV cache {} blocks x {} tokens ({:.2} GiB), CUDA graphs {}, GEMM prefill attention up to {} tokens ({:.0} MiB scratch)",
            gpu.name,
            weights.bytes() as f64 / (1u64 << 30) as f64,
            num_blocks,
            opts.block_size,
            kv.bytes() as f64 / (1u64 << 30) as f64,
            if opts.cuda_graphs { "on" } else { "off" },
            gemm_max_len,
            gemm_scratch.as_ref().map_or(0, GemmScratch::bytes) as f64 / (1 << 20) as f64
        );
        Ok(CudaBackend {
            cfg,
            opts,
            weights,
            act,
            inv_freq,
            kv,
            kv_layer_bytes,
            num_blocks,
            max_blocks,
            max_tokens,
            max_seqs,
            gemm_max_len,
            gemm_scratch,
            gemm_keys,
            gemm_scores,
            graphs: HashMap::new(),
            tokens_host: Vec::new(),
            logprobs_host: Vec::new(),
            gpu,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn weights(&self) -> &GpuWeights {
        &self.weights
    }

    /// Runs the batch and returns the fp32 logits of each sampled sequence, in seq order
    /// (for comparisons with the CPU backend; `execute` never copies logits to the host).
    pub fn forward_logits(&mut self, batch: &BatchInput) -> anyhow::Result<Vec<Vec<f32>>> {
        self.gpu.ctx.bind_to_thread()?;
        let step = self.plan(batch, None)?;
        self.upload_step(&step)?;
        // SAFETY: the step's counts fit the buffers (checked in plan).
        unsafe { self.enqueue(&step)? };
        let v = self.cfg.vocab_size;
        let mut flat = vec![0f32; step.ns * v];
        self.gpu.download(&mut flat, self.act.logits.ptr())?;
        Ok(flat.chunks(v).map(<[f32]>::to_vec).collect())
    }

    fn k_cache(&self, layer: usize) -> u64 {
        self.kv.ptr() + (2 * layer * self.kv_layer_bytes) as u64
    }

    fn v_cache(&self, layer: usize) -> u64 {
        self.k_cache(layer) + self.kv_layer_bytes as u64
    }

    /// Packs the batch's metadata; with `pad_to`, a pure-decode batch is padded with dummy
    /// sequences (context 1, no KV write, greedy) to that many, at the full block-table width, so
    /// its layout matches the bucket's graph.
    fn plan(&self, batch: &BatchInput, pad_to: Option<usize>) -> anyhow::Result<Step> {
        batch
            .validate(self.opts.block_size, self.num_blocks)
            .map_err(|e| anyhow::anyhow!("invalid batch: {e}"))?;
        let real_s = batch.seqs.len();
        let s = pad_to.unwrap_or(real_s);
        let t = batch.num_tokens() + (s - real_s);
        anyhow::ensure!(
            t <= self.max_tokens,
            "step has {t} tokens; the CUDA backend was sized for {}",
            self.max_tokens
        );
        anyhow::ensure!(
            s <= self.max_seqs,
            "step has {s} sequences; the CUDA backend was sized for {}",
            self.max_seqs
        );
        let max_blocks = match pad_to {
            Some(_) => self.max_blocks,
            None => batch
                .seqs
                .iter()
                .map(|q| q.block_table.len())
                .max()
                .unwrap_or(1)
                .max(1),
        };
        anyhow::ensure!(
            max_blocks <= self.max_blocks,
            "a block table has {max_blocks} blocks; max_model_len allows {}",
            self.max_blocks
        );
        let nd = batch.seqs.iter().filter(|q| q.query_len == 1).count() + (s - real_s);
        // Prefill sequences go to the GEMM path while they are short enough and its scratch
        // lasts; the flash kernel's tiles cover the rest.
        let mut gemm_plan = GemmPlanner::new(
            self.gemm_max_len,
            self.cfg.num_attention_heads,
            self.gemm_keys,
            self.gemm_scores,
        );
        let mut gemm = Vec::new();
        let mut on_gemm = vec![false; real_s];
        let mut nt = 0;
        let mut row = 0;
        for (i, q) in batch.seqs.iter().enumerate() {
            if q.query_len > 1 {
                match gemm_plan.place(i, row, q.query_len, q.context_len) {
                    Some(g) => {
                        gemm.push(g);
                        on_gemm[i] = true;
                    }
                    None => nt += q.query_len.div_ceil(PREFILL_TILE),
                }
            }
            row += q.query_len;
        }
        let ns = batch.num_sampled() + (s - real_s);
        let layout = Layout::new(t, s, nd, nt, gemm.len(), ns, max_blocks);
        let mut meta = vec![0u32; layout.total];
        let mut args = Vec::with_capacity(ns);
        let (mut dec, mut tile, mut samp) = (0, 0, 0);
        meta[layout.tokens..layout.tokens + batch.num_tokens()].copy_from_slice(&batch.token_ids);
        meta[layout.positions..layout.positions + batch.num_tokens()]
            .copy_from_slice(&batch.positions);
        meta[layout.slots..layout.slots + batch.num_tokens()].copy_from_slice(&batch.slot_mapping);
        let mut start = 0usize;
        let mut max_context = 1;
        for (i, q) in batch.seqs.iter().enumerate() {
            meta[layout.ctx + i] = q.context_len as u32;
            meta[layout.q_start + i] = start as u32;
            meta[layout.q_len + i] = q.query_len as u32;
            let bt = layout.block_tables + i * max_blocks;
            meta[bt..bt + q.block_table.len()].copy_from_slice(&q.block_table);
            if q.query_len == 1 {
                meta[layout.dec_row + dec] = start as u32;
                meta[layout.dec_seq + dec] = i as u32;
                dec += 1;
            } else if !on_gemm[i] {
                for q0 in (0..q.query_len).step_by(PREFILL_TILE) {
                    meta[layout.tile_seq + tile] = i as u32;
                    meta[layout.tile_q0 + tile] = q0 as u32;
                    tile += 1;
                }
            }
            if let Some(smp) = &q.sample {
                meta[layout.sample_rows + samp] = (start + q.query_len - 1) as u32;
                samp += 1;
                let p = &smp.params;
                args.push(SampleArgs {
                    seed: smp.seed,
                    output_index: smp.output_index as u64,
                    temperature: p.temperature,
                    top_p: p.top_p,
                    min_p: p.min_p,
                    top_k: p.top_k.min(i32::MAX as usize) as i32,
                });
            }
            max_context = max_context.max(q.context_len);
            start += q.query_len;
        }
        for (k, g) in gemm.iter().enumerate() {
            meta[layout.gemm_seq + k] = g.seq as u32;
            meta[layout.gemm_key0 + k] = g.key0 as u32;
            meta[layout.gemm_s0 + k] = g.s0 as u32;
        }
        // Padding: one dummy token per dummy sequence, at position 0 in block 0, never written.
        for i in real_s..s {
            let row = start + (i - real_s);
            meta[layout.slots + row] = u32::MAX;
            meta[layout.ctx + i] = 1;
            meta[layout.q_start + i] = row as u32;
            meta[layout.q_len + i] = 1;
            meta[layout.dec_row + dec] = row as u32;
            meta[layout.dec_seq + dec] = i as u32;
            dec += 1;
            meta[layout.sample_rows + samp] = row as u32;
            samp += 1;
            args.push(SampleArgs::default());
        }
        // The kernel derives each split's length from the context at run time, so a graph
        // captured for a split count serves every context; graphs are keyed by it.
        let splits = decode_splits(
            self.gpu.num_sms,
            nd,
            self.cfg.num_key_value_heads,
            max_context,
        );
        Ok(Step {
            t,
            nd,
            nt,
            ns,
            max_blocks,
            splits,
            gemm,
            layout,
            meta,
            args,
        })
    }

    fn upload_step(&self, step: &Step) -> anyhow::Result<()> {
        self.gpu.upload(self.act.meta.ptr(), &step.meta)?;
        self.gpu.upload(self.act.args.ptr(), &step.args)
    }

    /// Enqueues the whole forward and sampling of `step` on the stream (also under capture).
    ///
    /// # Safety
    /// `step` came from `plan` (its counts fit the buffers) and its metadata is uploaded (or will
    /// be, before a captured graph of it is launched).
    unsafe fn enqueue(&self, step: &Step) -> anyhow::Result<()> {
        let c = &self.cfg;
        let g = &self.gpu;
        let a = &self.act;
        let lay = &step.layout;
        let m = |off: usize| a.meta.at::<u32>(off);
        let (t, d, hd) = (step.t, c.hidden_size, c.head_dim);
        let (h, kvh, inter) = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.intermediate_size,
        );
        let qkv_dim = c.q_dim() + 2 * c.kv_dim();
        let eps = c.rms_norm_eps as f32;
        let scale = 1.0 / (hd as f32).sqrt();
        // Few enough rows for the gemv kernels: their fused epilogues replace two launches.
        let fused = self.opts.fuse_decode && t <= g.gemv_max_m && d % 8 == 0 && inter % 8 == 0;
        let on = |kind: u32| self.opts.skip & kind == 0;
        kernels::embedding(
            g,
            &EmbeddingParams {
                table: self.weights.embed.ptr(),
                tokens: m(lay.tokens),
                out: a.residual.ptr(),
                num_tokens: t as i32,
                d: d as i32,
            },
        )?;
        for (l, w) in self.weights.layers.iter().enumerate() {
            let norm = AddRmsNormParams {
                residual: a.residual.ptr(),
                delta: if l == 0 { 0 } else { a.delta.ptr() },
                weight: w.input_norm.ptr(),
                rows: 0,
                out: a.xn.ptr(),
                num_rows: t as i32,
                d: d as i32,
                eps,
            };
            if on(skip::NORMS) {
                kernels::add_rmsnorm(g, &norm)?;
            }
            if fused {
                kernels::gemv_qkv_rope(
                    g,
                    &GemvQkvRopeParams {
                        x: a.xn.ptr(),
                        w: w.qkv.ptr(),
                        positions: m(lay.positions),
                        slots: m(lay.slots),
                        inv_freq: self.inv_freq.ptr(),
                        q_out: a.q.ptr(),
                        k_cache: self.k_cache(l),
                        v_cache: self.v_cache(l),
                        m: t as i32,
                        k: d as i32,
                        num_heads: h as i32,
                        num_kv_heads: kvh as i32,
                        head_dim: hd as i32,
                        block_size: self.opts.block_size as i32,
                        split: kernels::gemv_split(g, d),
                    },
                )?;
            } else if on(skip::LINEAR) {
                linear(g, a.xn.ptr(), w.qkv.ptr(), a.qkv.ptr(), t, qkv_dim, d, true)?;
            }
            if !fused && on(skip::ROPE) {
                kernels::rope_kv(
                    g,
                    &RopeKvParams {
                        qkv: a.qkv.ptr(),
                        positions: m(lay.positions),
                        slots: m(lay.slots),
                        inv_freq: self.inv_freq.ptr(),
                        q_out: a.q.ptr(),
                        k_cache: self.k_cache(l),
                        v_cache: self.v_cache(l),
                        num_tokens: t as i32,
                        num_heads: h as i32,
                        num_kv_heads: kvh as i32,
                        head_dim: hd as i32,
                        block_size: self.opts.block_size as i32,
                    },
                )?;
            }
            if step.nd > 0 && on(skip::ATTENTION) {
                let p = PagedDecodeParams {
                    q: a.q.ptr(),
                    k_cache: self.k_cache(l),
                    v_cache: self.v_cache(l),
                    item_row: m(lay.dec_row),
                    item_seq: m(lay.dec_seq),
                    block_tables: m(lay.block_tables),
                    context_lens: m(lay.ctx),
                    out: a.attn.ptr(),
                    part_acc: a.part_acc.ptr(),
                    part_ml: a.part_ml.ptr(),
                    num_items: step.nd as i32,
                    num_heads: h as i32,
                    num_kv_heads: kvh as i32,
                    block_size: self.opts.block_size as i32,
                    max_blocks: step.max_blocks as i32,
                    num_splits: step.splits as i32,
                    scale,
                };
                kernels::paged_decode(g, &p, hd)?;
            }
            if step.nt > 0 {
                let p = PrefillAttnParams {
                    q: a.q.ptr(),
                    k_cache: self.k_cache(l),
                    v_cache: self.v_cache(l),
                    tile_seq: m(lay.tile_seq),
                    tile_q0: m(lay.tile_q0),
                    q_start: m(lay.q_start),
                    q_len: m(lay.q_len),
                    context_lens: m(lay.ctx),
                    block_tables: m(lay.block_tables),
                    out: a.attn.ptr(),
                    num_tiles: step.nt as i32,
                    num_heads: h as i32,
                    num_kv_heads: kvh as i32,
                    block_size: self.opts.block_size as i32,
                    max_blocks: step.max_blocks as i32,
                    scale,
                };
                kernels::prefill_attn(g, &p, hd)?;
            }
            if !step.gemm.is_empty() {
                let scratch = self
                    .gemm_scratch
                    .as_ref()
                    .context("GEMM prefill sequences planned without scratch")?;
                prefill_gemm::gemm_attention(
                    g,
                    &GemmAttention {
                        q: a.q.ptr(),
                        out: a.attn.ptr(),
                        k_cache: self.k_cache(l),
                        v_cache: self.v_cache(l),
                        q_lens: m(lay.q_len),
                        context_lens: m(lay.ctx),
                        block_tables: m(lay.block_tables),
                        gemm_seq: m(lay.gemm_seq),
                        gemm_key0: m(lay.gemm_key0),
                        gemm_s0: m(lay.gemm_s0),
                        k_buf: scratch.k.ptr(),
                        v_buf: scratch.v.ptr(),
                        scores: scratch.scores.ptr(),
                        seqs: &step.gemm,
                        num_heads: h,
                        num_kv_heads: kvh,
                        head_dim: hd,
                        block_size: self.opts.block_size,
                        max_blocks: step.max_blocks,
                        scale,
                    },
                )?;
            }
            if on(skip::LINEAR) {
                linear(
                    g,
                    a.attn.ptr(),
                    w.o.ptr(),
                    a.delta.ptr(),
                    t,
                    d,
                    c.q_dim(),
                    false,
                )?;
            }
            if on(skip::NORMS) {
                kernels::add_rmsnorm(
                    g,
                    &AddRmsNormParams {
                        delta: a.delta.ptr(),
                        weight: w.post_norm.ptr(),
                        ..norm
                    },
                )?;
            }
            if fused {
                kernels::gemv_silu(
                    g,
                    &GemvSiluParams {
                        x: a.xn.ptr(),
                        w: w.gate_up.ptr(),
                        out: a.act.ptr(),
                        m: t as i32,
                        inter: inter as i32,
                        k: d as i32,
                        split: kernels::gemv_split(g, d),
                    },
                )?;
            } else if on(skip::LINEAR) {
                linear(
                    g,
                    a.xn.ptr(),
                    w.gate_up.ptr(),
                    a.gate_up.ptr(),
                    t,
                    2 * inter,
                    d,
                    true,
                )?;
            }
            if !fused && on(skip::SILU) {
                kernels::silu_mul(
                    g,
                    &SiluMulParams {
                        gate_up: a.gate_up.ptr(),
                        out: a.act.ptr(),
                        num_tokens: t as i32,
                        inter: inter as i32,
                    },
                )?;
            }
            if on(skip::LINEAR) {
                linear(
                    g,
                    a.act.ptr(),
                    w.down.ptr(),
                    a.delta.ptr(),
                    t,
                    d,
                    inter,
                    false,
                )?;
            }
        }
        if step.ns == 0 {
            return Ok(());
        }
        let final_norm = AddRmsNormParams {
            residual: a.residual.ptr(),
            delta: a.delta.ptr(),
            weight: self.weights.norm.ptr(),
            rows: m(lay.sample_rows),
            out: a.head_in.ptr(),
            num_rows: step.ns as i32,
            d: d as i32,
            eps,
        };
        kernels::add_rmsnorm(g, &final_norm)?;
        linear(
            g,
            a.head_in.ptr(),
            self.weights.lm_head_ptr(),
            a.logits.ptr(),
            step.ns,
            c.vocab_size,
            d,
            true,
        )?;
        kernels::sample(
            g,
            &SampleParams {
                logits: a.logits.ptr(),
                args: a.args.ptr(),
                tokens: a.out_tokens.ptr(),
                logprobs: a.out_logprobs.ptr(),
                num_rows: step.ns as i32,
                vocab: c.vocab_size as i32,
            },
        )
    }

    fn graph_bucket(&self, batch: &BatchInput) -> Option<usize> {
        let pure_decode = batch
            .seqs
            .iter()
            .all(|q| q.query_len == 1 && q.sample.is_some());
        if !self.opts.cuda_graphs || !pure_decode || batch.seqs.is_empty() {
            return None;
        }
        GRAPH_BUCKETS
            .iter()
            .copied()
            .find(|&b| b >= batch.seqs.len() && b <= self.max_seqs)
    }

    /// Captures the forward of `step` (its layout is the bucket's) into a graph.
    fn capture(&self, step: &Step) -> anyhow::Result<DecodeGraph> {
        let stream = &self.gpu.stream;
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        // SAFETY: plan() sized the step; the metadata is uploaded before every launch.
        let enqueued = unsafe { self.enqueue(step) };
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        enqueued.context("capturing a decode step")?;
        let graph = graph
            .context("instantiating a decode graph")?
            .context("capture produced no graph")?;
        Ok(DecodeGraph(graph))
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> BackendInfo {
        let (major, minor) = self.gpu.compute_capability;
        BackendInfo {
            device: format!(
                "cuda:{} ({}, sm_{major}{minor})",
                self.opts.device_ordinal, self.gpu.name
            ),
            num_kv_blocks: self.num_blocks,
            block_size: self.opts.block_size,
            bytes_per_block: kv_bytes_per_block(&self.cfg, self.opts.block_size),
        }
    }

    fn execute(&mut self, batch: &BatchInput) -> anyhow::Result<StepOutput> {
        let started = Instant::now();
        self.gpu.ctx.bind_to_thread()?;
        let bucket = self.graph_bucket(batch);
        let step = self.plan(batch, bucket)?;
        self.upload_step(&step)?;
        match bucket {
            Some(b) => {
                let key = (b, step.splits);
                if !self.graphs.contains_key(&key) {
                    let graph = self.capture(&step)?;
                    self.graphs.insert(key, graph);
                }
                self.graphs[&key]
                    .0
                    .launch()
                    .context("launching a decode graph")?;
            }
            // SAFETY: plan() checked the counts against the buffers; the metadata is uploaded.
            None => unsafe { self.enqueue(&step)? },
        }
        let ns = batch.num_sampled();
        self.tokens_host.resize(ns, 0);
        self.logprobs_host.resize(ns, 0.0);
        // The first ns rows are the real sequences' (padding rows come after them).
        // SAFETY: both buffers hold max_seqs >= ns entries; sync() completes the copies.
        unsafe {
            self.gpu
                .download_async(&mut self.tokens_host, self.act.out_tokens.ptr())?;
            self.gpu
                .download_async(&mut self.logprobs_host, self.act.out_logprobs.ptr())?;
        }
        self.gpu.sync()?;
        let sampled = batch
            .seqs
            .iter()
            .filter(|q| q.sample.is_some())
            .zip(self.tokens_host.iter().zip(&self.logprobs_host))
            .map(|(q, (&token, &logprob))| SampledToken {
                request_id: q.request_id,
                token: token as u32,
                logprob,
            })
            .collect();
        Ok(StepOutput {
            sampled,
            elapsed: started.elapsed(),
        })
    }
}

/// Bytes of one KV block across all layers, K and V, bf16.
pub fn kv_bytes_per_block(cfg: &ModelConfig, block_size: usize) -> usize {
    2 * cfg.num_hidden_layers * cfg.num_key_value_heads * block_size * cfg.head_dim * 2
}

/// Refuses models the kernels do not cover, with the reason.
pub fn check_supported(cfg: &ModelConfig) -> anyhow::Result<()> {
    let group = cfg.num_attention_heads / cfg.num_key_value_heads;
    anyhow::ensure!(
        kernels::attention_supported(cfg.head_dim, group),
        "the CUDA attention kernels support head_dim 64 or 128 and 1, 2, 3, 4, 6 or 8 query heads per kv head; this model has head_dim {} and {group}",
        cfg.head_dim
    );
    anyhow::ensure!(
        !cfg.attention_bias && !cfg.mlp_bias,
        "the CUDA executor does not support attention or MLP biases yet"
    );
    anyhow::ensure!(
        cfg.hidden_size <= 8192 && cfg.hidden_size % 8 == 0 && cfg.head_dim % 8 == 0,
        "the RMSNorm kernel takes hidden sizes up to 8192 that are a multiple of 8; this model has {}",
        cfg.hidden_size
    );
    if let Some(w) = cfg.sliding_window {
        tracing::warn!("sliding_window {w} is ignored by the CUDA executor: attention covers the whole context");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_sections_are_disjoint_and_depend_on_counts_only() {
        let l = Layout::new(10, 3, 2, 1, 2, 3, 5);
        assert_eq!(l.tokens, 0);
        assert_eq!(l.positions, 10);
        assert_eq!(l.ctx, 30);
        assert_eq!(l.gemm_seq, 30 + 9 + 4 + 2);
        assert_eq!(l.block_tables, 30 + 9 + 4 + 2 + 6 + 3);
        assert_eq!(l.total, l.block_tables + 15);
        assert_eq!(Layout::new(10, 3, 2, 1, 2, 3, 5), l);
        // No GEMM-path sequences: the layout a decode graph was captured with.
        let d = Layout::new(4, 4, 4, 0, 0, 4, 7);
        assert_eq!((d.gemm_seq, d.gemm_s0, d.sample_rows), (32, 32, 32));
    }
}
