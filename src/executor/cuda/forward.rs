//! The GPU side of the CUDA backend: weights, activations, the paged KV pool, the persistent
//! block tables, and one step's launches.
//!
//! A step: its metadata (`step_meta`) is uploaded with one copy, `block_table_update` brings the
//! device block tables up to date from the entries that changed, then the forward is a fixed
//! chain of launches on one stream:
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
//! Pure-decode steps are padded to a batch-size bucket and replayed from a CUDA graph captured
//! on the bucket's first use; the table update runs before the replay, outside the graph. With
//! `verify_graphs` (opt-in) so are verification steps whose sequences all verify k drafts,
//! keyed by (bucket, k) and the flash kernel's split count (`step_meta::graph_shape`).
//!
//! The copies to and from the host are in `io` (pageable, or pinned and double-buffered); the
//! device-kept token counts of requests with penalties in `counts`. With lookahead
//! (`lookahead` module docs) a predicted next step is launched behind the current one before
//! the host waits, its input tokens fed on the device (`feed_tokens`).
//!
//! Model families: `rope_kv` adds q/k/v biases (Qwen2) and normalises q and k heads (Qwen3)
//! before RoPE (cos/sin times longrope's attention factor); both attention kernels, compiled for
//! the model's head_dim and GQA group when the GPU is opened here, read only the sliding window
//! (blocks before it may be `NULL_BLOCK`), and the GEMM path takes only contexts within it.
//!
//! (Just over 600 lines: the step's launch sequence reads best in one place; counts, lookahead,
//! graphs, I/O and logit read-back live in forward/.)

use std::collections::HashMap;

use anyhow::Context;
use cudarc::driver::CudaGraph;

use super::collective::TpLink;
use super::device::{DevBuf, Gpu};
use super::fp8_gemm::Fp8Gemm;
use super::kernels::{
    self, decode_group_ctas_for, decode_splits_filled, prefill_split_scratch,
    BlockTableUpdateParams, CountUpdate, FeedTokensParams, GEMV_MAX_M, PREFILL_TILE,
    SAMPLE_MAX_TOP,
};
use super::lookahead::{self, Gate, LookaheadStats};
use super::options::{CudaBackendOptions, DecodeKernel, KvCacheDtype};
use super::prefill_gemm::{self, GemmScratch};
use super::step_meta::{self, GraphShape, HostMeta, Layout, Limits, Step};
use super::weights::GpuWeights;
use crate::model::config::ModelConfig;
use crate::sampling::params::{MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS};
use crate::step::{BatchInput, SampledToken, TopLogprobs};
use io::{out_bytes, read_outputs, read_top, wants_top, PinnedIo, OUT_TOKENS};

/// Kept free beyond the weights, activations and KV pool: cuBLAS, graphs, fragmentation.
const RESERVE_BYTES: usize = 1 << 30;

const MAX_SPLITS: usize = 32;

/// Logit edits one sampled row may need: its bias, its stop ids and the model's eos ids.
const MAX_EDITS_PER_ROW: usize = MAX_LOGIT_BIAS + MAX_STOP_TOKEN_IDS + 64;

/// Token-count updates sent per launch of `sample_counts_update` (a long prompt takes several).
const COUNT_UPDATE_CHUNK: usize = 1 << 16;

mod ahead;
mod counts;
mod graphs;
mod io;
mod layers;
mod logits;

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
    /// Arrival counters of the in-kernel split merge (`decode_merge_inline`), zero between launches.
    decode_counters: DevBuf,
    /// Flash prefill attention's split partials and arrival counters (zero between launches),
    /// sized by `kernels::prefill_split_scratch`; one element each when splitting is off.
    prefill_acc: DevBuf,
    prefill_ml: DevBuf,
    prefill_counters: DevBuf,
    meta: DevBuf,
    /// The step's outputs: timing stamps, sampled tokens, log-probabilities, top
    /// log-probabilities (`io`).
    out: DevBuf,
    /// The sampler's processed logits (rows with logit edits or penalties).
    work: DevBuf,
    /// Token counts of requests with penalties, `[max_seqs, vocab]` (see sample.cu), and the
    /// staging buffer of their updates.
    counts: DevBuf,
    count_updates: DevBuf,
}

/// A launched step whose outputs `sampled` reads: its pinned stage (None: pageable), its
/// sampled rows (padding included) and whether its top log-probabilities were copied back.
#[derive(Debug, Clone, Copy)]
struct Launched {
    stage: Option<usize>,
    ns: usize,
    top: bool,
}

/// A step launched ahead (lookahead): the batch predicted for the next plan, and its launch.
struct Ahead {
    batch: BatchInput,
    launched: Launched,
}

/// What a captured graph bakes in besides the metadata it reads: the step's shape, the decode
/// split count (0 without decode items) and the flash prefill split count (1 without tiles).
type GraphKey = (GraphShape, usize, usize);

/// A captured decode (or verification) step. CUDA graphs may be used from one thread at a
/// time; the backend owns its graphs and is itself used by one thread at a time (it is moved,
/// never shared).
struct DecodeGraph(CudaGraph);
// SAFETY: see above; the graph is only launched by the backend's owner.
unsafe impl Send for DecodeGraph {}

pub(super) struct Forward {
    pub cfg: ModelConfig,
    pub opts: CudaBackendOptions,
    pub weights: GpuWeights,
    act: Activations,
    inv_freq: DevBuf,
    /// K and V of all layers: layer l's K at kv_base + 2 l · layer_bytes, its V after it.
    kv: DevBuf,
    kv_layer_bytes: usize,
    /// Each layer's K and V tensor maps for the TMA prefill kernel (`kernels::kv_tensor_maps`),
    /// where it is built; rebuilt with the pool.
    kv_maps: Option<DevBuf>,
    /// `[max_seqs + 1, max_blocks]` block ids: row r is the persistent batch's row r (the last
    /// row serves graph padding). Updated in place, never re-uploaded whole.
    block_tables: DevBuf,
    pub num_blocks: usize,
    pub max_blocks: usize,
    pub max_tokens: usize,
    pub max_seqs: usize,
    /// Logit rows a step may sample: one per sequence, plus the drafts of speculative decoding
    /// (`CudaBackendOptions::max_drafts`).
    max_rows: usize,
    /// GEMM prefill path: its context limit (at most the longest context), scratch and the
    /// scratch's capacities (key rows, score floats); no scratch when off.
    gemm_max_len: usize,
    gemm_scratch: Option<GemmScratch>,
    gemm_keys: usize,
    gemm_scores: usize,
    /// How decode attention splits its keys (`Limits::decode_splits`).
    decode_rule: kernels::DecodeSplitRule,
    /// Keyed by shape and split counts: the grids are baked into the launches.
    graphs: HashMap<GraphKey, DecodeGraph>,
    // Host buffers reused across steps.
    host: HostMeta,
    tokens_host: Vec<i32>,
    logprobs_host: Vec<f32>,
    top_ids_host: Vec<i32>,
    top_logprobs_host: Vec<f32>,
    count_updates_host: Vec<CountUpdate>,
    /// The pageable copy of the step's outputs (without `pinned_io`).
    out_host: Vec<u32>,
    /// Pinned staging (`pinned_io` or `lookahead`); None: pageable copies.
    io: Option<PinnedIo>,
    /// The launch `sampled` reads next.
    cur: Option<Launched>,
    /// Lookahead: the step launched ahead of the plan, if any, and what it was fed (the last
    /// step's samples as `feed_tokens` wrote them).
    ahead: Option<Ahead>,
    fed: Vec<u32>,
    /// A spare prediction buffer (kept to reuse its allocations).
    spare: BatchInput,
    /// Gated lookahead (`lookahead_gate_us`): whether launching ahead pays, and the prediction
    /// it held back last (checked against the next plan all the same, on the host).
    gate: Option<Gate>,
    held: Option<BatchInput>,
    pub lookahead_stats: LookaheadStats,
    /// Verification steps replayed from graphs (`verify_graphs`): all, and those padded with
    /// dummy verifications (tests check the path ran).
    pub verify_graph_steps: (u64, u64),
    /// GPU stamps (start, end) of the last step read by `sampled` (`step_timing`).
    pub last_stamps: Option<(u64, u64)>,
    /// The fp8 GEMM path of e4m3 weights (`--quantization fp8`); None: bf16 weights.
    fp8: Option<Fp8Gemm>,
    /// This rank's end of a tensor-parallel world (`cuda::tp`): its weights are a shard, and
    /// the forward meets the other ranks after the embedding, the o and down projections and
    /// the LM head. None: the whole model on one GPU.
    pub tp: Option<TpLink>,
    // Declared last: dropped after every buffer above.
    pub gpu: Gpu,
}

/// How the KV pool is sized.
#[derive(Debug, Clone, Copy)]
pub(super) enum KvSizing {
    /// From what `gpu_memory_utilization` leaves; each block also costs `shared_bytes` in
    /// another pool addressed by the same block ids (a draft model's), allocated after.
    Free { shared_bytes: usize },
    /// Exactly this many blocks.
    Blocks(usize),
}

/// The decode split rule's CTAs per SM (`Limits::decode_ctas_per_sm`, and the split scratch's
/// size): the option's, at most twice the tensor-core kernel's resident CTAs (`DMMA_MIN_CTAS`
/// in paged_decode_mma.cu: 2 an SM with a bf16 cache, 3 with e4m3 when this was measured; the
/// e4m3 ring since has 4, and was measured at 6 too, session 49) on that kernel. Aiming at
/// the lane kernel's 8 cut GQA batches into more splits than the SMs hold: on the H200
/// (`gpu-bench attention`, session 17 calls 3 and 5, Llama-3-8B and Qwen2.5-7B heads) fill 4
/// was never more than 3 % slower than fill 8 at 2 resident CTAs and up to 30 % faster
/// (Qwen2.5-7B, batch 256 at 1k: 135 against 192 µs); at 3 (session 18, call 3) fill 6 and 4
/// were within 3 % of each other in total.
pub fn decode_fill(
    opts: &CudaBackendOptions,
    head_dim: usize,
    group: usize,
    kv_fp8: bool,
) -> usize {
    let cap = match kernels::decode_kernel(opts.decode_kernel, head_dim, group, kv_fp8) {
        DecodeKernel::Mma if kv_fp8 => 6,
        DecodeKernel::Mma => 4,
        _ => usize::MAX,
    };
    match opts.decode_ctas_per_sm {
        0 => 0,
        n => n.min(cap),
    }
}

/// The decode split rule the backend serves with on `gpu` (its cache dtype set) for this head
/// shape under `opts`: `decode_fill`'s CTAs an SM, the kernel `kernels::decode_kernel` picks,
/// and the kernel's wave where its splits may merge in a cluster (`opts.decode_cluster`, sm_90).
pub fn decode_split_rule(
    gpu: &Gpu,
    opts: &CudaBackendOptions,
    head_dim: usize,
    num_heads: usize,
    num_kv_heads: usize,
) -> anyhow::Result<kernels::DecodeSplitRule> {
    let group = num_heads / num_kv_heads;
    let (cluster_wave, per_head) =
        match opts.decode_cluster && kernels::decode_cluster_supported(gpu) {
            true => kernels::decode_wave(gpu, opts.decode_kernel, head_dim, group)?,
            false => (0, 0),
        };
    Ok(kernels::DecodeSplitRule {
        num_sms: gpu.num_sms,
        num_heads,
        num_kv_heads,
        ctas_per_sm: decode_fill(opts, head_dim, group, gpu.kv_fp8()),
        kernel: kernels::decode_kernel(opts.decode_kernel, head_dim, group, gpu.kv_fp8()),
        min_keys: opts.decode_min_split_keys,
        cluster_wave,
        item_ctas: num_kv_heads * per_head,
    })
}

impl Forward {
    pub fn new(
        mut gpu: Gpu,
        cfg: ModelConfig,
        weights: GpuWeights,
        opts: CudaBackendOptions,
        sizing: KvSizing,
    ) -> anyhow::Result<Self> {
        gpu.set_kv_fp8(opts.kv_cache_dtype.is_fp8())?;
        let mut weights = weights;
        let fp8 = match opts.quantization.is_fp8() {
            true => {
                let max_k = cfg.hidden_size.max(cfg.q_dim()).max(cfg.intermediate_size);
                let f = Fp8Gemm::new(&gpu, opts.max_num_batched_tokens, max_k)?;
                weights.quantize_fp8(&gpu, f.quantizer())?;
                Some(f)
            }
            false => None,
        };
        anyhow::ensure!(
            matches!(opts.prefill_wg_stages, 1 | 2),
            "prefill_wg_stages is 1 or 2, got {}",
            opts.prefill_wg_stages
        );
        gpu.prefill_wg_stages = opts.prefill_wg_stages;
        gpu.prefill_tma = opts.prefill_tma;
        gpu.decode_defines = opts.decode_defines.clone();
        gpu.load_attention(
            cfg.head_dim,
            cfg.num_attention_heads / cfg.num_key_value_heads,
        )?;
        gpu.gemv_max_m = opts.gemv_max_rows.min(GEMV_MAX_M);
        gpu.gemv_split = opts.gemv_split;
        gpu.gemv_bulk &= opts.gemv_bulk;
        gpu.gemv_smem = opts.gemv_smem;
        gpu.pdl &= opts.pdl;
        gpu.pdl_small = opts.pdl_small;
        let decode_rule = decode_split_rule(
            &gpu,
            &opts,
            cfg.head_dim,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
        )?;
        gpu.prefill_wgmma &= opts.prefill_wgmma;
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
        // Each sequence samples 1 + its drafts rows, and a row is a token of the step.
        let max_rows = (max_seqs * (1 + opts.max_drafts)).min(max_tokens.max(max_seqs));
        let (d, hd, h) = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads);
        let qkv_dim = cfg.q_dim() + 2 * cfg.kv_dim();
        let max_tiles = max_tokens / PREFILL_TILE + max_seqs;
        // Block-table rows: one per sequence slot, and the padding row of a graph step.
        let table_words = (max_seqs + 1) * max_blocks;
        let meta_words = Layout::new(
            max_tokens,
            max_seqs + 1,
            max_seqs,
            max_tiles,
            max_seqs,
            max_rows,
            max_seqs * MAX_EDITS_PER_ROW,
            table_words,
        )
        .total;
        let (bf, f4) = (2usize, 4usize);
        // Decode split partials: (item, split) pairs of the largest decode step the split rule
        // allows, and one arrival counter per (item, kv head slice) for the in-kernel merge.
        let group = h / cfg.num_key_value_heads;
        let partials = match decode_fill(&opts, hd, group, gpu.kv_fp8()) {
            0 => max_seqs * MAX_SPLITS,
            c => (1..=max_seqs)
                .map(|n| {
                    let splits = decode_splits_filled(
                        gpu.num_sms,
                        c,
                        n,
                        cfg.num_key_value_heads,
                        group,
                        max_blocks * opts.block_size,
                        // The fewest keys a split any rule allows: the most splits.
                        kernels::MIN_SPLIT_KEYS,
                    );
                    n * splits
                })
                .max()
                .unwrap_or(1),
        };
        let counters =
            max_seqs * cfg.num_key_value_heads * decode_group_ctas_for(group, gpu.kv_fp8());
        let (pf_acc, pf_ml, pf_counters) = match opts.prefill_split_kv {
            true => prefill_split_scratch(gpu.num_sms, hd),
            false => (1, 1, 1),
        };
        let act = Activations {
            residual: gpu.alloc(max_tokens * d * f4)?,
            xn: gpu.alloc(max_tokens * d * bf)?,
            // fp32: the GEMM outputs that RoPE and SiLU × up read (see rope_kv.cu); gate|up in
            // bf16 with `gate_up_bf16`.
            qkv: gpu.alloc(max_tokens * qkv_dim * f4)?,
            q: gpu.alloc(max_tokens * cfg.q_dim() * bf)?,
            attn: gpu.alloc(max_tokens * cfg.q_dim() * bf)?,
            delta: gpu.alloc(max_tokens * d * bf)?,
            gate_up: gpu.alloc(
                max_tokens * 2 * cfg.intermediate_size * if opts.gate_up_bf16 { bf } else { f4 },
            )?,
            act: gpu.alloc(max_tokens * cfg.intermediate_size * bf)?,
            head_in: gpu.alloc(max_rows * d * bf)?,
            logits: gpu.alloc(max_rows * cfg.vocab_size * f4)?,
            part_acc: gpu.alloc(partials * h * hd * f4)?,
            part_ml: gpu.alloc(partials * h * 2 * f4)?,
            decode_counters: gpu.alloc(counters * 4)?,
            prefill_acc: gpu.alloc(pf_acc * f4)?,
            prefill_ml: gpu.alloc(pf_ml * f4)?,
            prefill_counters: gpu.alloc(pf_counters * 4)?,
            meta: gpu.alloc(meta_words * 4)?,
            out: gpu.alloc(out_bytes(max_rows, true))?,
            work: gpu.alloc(max_rows * cfg.vocab_size * f4)?,
            counts: gpu.alloc(max_seqs * cfg.vocab_size * 4)?,
            count_updates: gpu.alloc(COUNT_UPDATE_CHUNK * std::mem::size_of::<CountUpdate>())?,
        };
        gpu.memset(act.decode_counters.ptr(), 0, counters * 4)?;
        gpu.memset(act.prefill_counters.ptr(), 0, pf_counters * 4)?;
        if opts.verify_graphs {
            // A verification graph's padding rows past its first dummy's are never attended
            // (nor sampled, nor cached): zeroed once, they stay finite.
            gpu.memset(act.attn.ptr(), 0, act.attn.bytes())?;
        }
        // Stamps read before any step wrote them are zero, not garbage.
        gpu.memset(act.out.ptr(), 0, out_bytes(max_rows, true))?;
        let io = match opts.pinned_io || opts.lookahead {
            true => Some(PinnedIo::new(&gpu, meta_words, max_rows)?),
            false => None,
        };
        anyhow::ensure!(
            max_seqs * cfg.vocab_size <= u32::MAX as usize,
            "max_num_seqs {max_seqs} x vocab {} token counts exceed 32-bit indices",
            cfg.vocab_size
        );
        // A row's counts are cleared when a request with penalties takes it; zero them anyway.
        gpu.memset(act.counts.ptr(), 0, act.counts.bytes())?;
        let inv: Vec<f32> = cfg
            .rope
            .inv_freqs(hd)
            .into_iter()
            .map(|f| f as f32)
            .collect();
        let inv_freq = gpu.alloc(inv.len() * 4)?;
        gpu.upload(inv_freq.ptr(), &inv)?;
        // Only contexts within the sliding window take the GEMM path: there the window masks
        // nothing, and no block of the context has been freed (kv_gather reads them all).
        let gemm_max_len = opts
            .prefill_gemm_max_len
            .min(max_blocks * opts.block_size)
            .min(cfg.sliding_window.unwrap_or(usize::MAX));
        let (gemm_keys, gemm_scores) =
            prefill_gemm::scratch_capacity(gemm_max_len, max_tokens, max_seqs, h);
        let gemm_scratch = match gemm_keys {
            0 => None,
            _ => Some(GemmScratch::alloc(&gpu, gemm_keys, gemm_scores, h, hd)?),
        };
        // Zeroed: every entry is a valid block id, so padding reads stay in the pool.
        let block_tables = gpu.alloc(table_words * 4)?;
        gpu.memset(block_tables.ptr(), 0, table_words * 4)?;
        gpu.sync()?;

        // The KV pool takes what the utilisation target leaves after everything above.
        let bytes_per_block = kv_bytes_per_block(&cfg, opts.block_size, opts.kv_cache_dtype);
        let (free, total) = gpu.mem_info()?;
        let used = total - free;
        let target = (total as f64 * opts.gpu_memory_utilization) as usize;
        let mut kv_bytes = target.saturating_sub(used + RESERVE_BYTES);
        if let Some(cap) = opts.max_kv_cache_bytes {
            kv_bytes = kv_bytes.min(cap);
        }
        let num_blocks = match sizing {
            KvSizing::Free { shared_bytes } => kv_bytes / (bytes_per_block + shared_bytes),
            KvSizing::Blocks(n) => n,
        };
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
            "CUDA backend on {}: weights {:.2} GiB ({}), KV cache {} blocks x {} tokens ({:.2} GiB, {}), CUDA graphs {}, GEMM prefill attention up to {} tokens ({:.0} MiB scratch)",
            gpu.name,
            weights.bytes() as f64 / (1u64 << 30) as f64,
            if weights.fp8() { "linear layers fp8 e4m3" } else { "bf16" },
            num_blocks,
            opts.block_size,
            kv.bytes() as f64 / (1u64 << 30) as f64,
            if gpu.kv_fp8() { "fp8 e4m3" } else { "bf16" },
            if opts.cuda_graphs { "on" } else { "off" },
            gemm_max_len,
            gemm_scratch.as_ref().map_or(0, GemmScratch::bytes) as f64 / (1 << 20) as f64
        );
        let gate = opts.lookahead_gate_us.map(Gate::new);
        let mut forward = Forward {
            cfg,
            opts,
            weights,
            act,
            inv_freq,
            kv,
            kv_layer_bytes,
            kv_maps: None,
            block_tables,
            num_blocks,
            max_blocks,
            max_tokens,
            max_seqs,
            max_rows,
            gemm_max_len,
            gemm_scratch,
            gemm_keys,
            gemm_scores,
            decode_rule,
            graphs: HashMap::new(),
            host: HostMeta::default(),
            tokens_host: Vec::new(),
            logprobs_host: Vec::new(),
            top_ids_host: Vec::new(),
            top_logprobs_host: Vec::new(),
            count_updates_host: Vec::new(),
            out_host: Vec::new(),
            io,
            cur: None,
            ahead: None,
            fed: Vec::new(),
            spare: BatchInput::default(),
            gate,
            held: None,
            lookahead_stats: LookaheadStats::default(),
            verify_graph_steps: (0, 0),
            last_stamps: None,
            fp8,
            tp: None,
            gpu,
        };
        forward.kv_maps = forward.build_kv_maps()?;
        Ok(forward)
    }

    /// The TMA prefill kernel's tensor maps of the current pool, where the kernel is loaded
    /// (`Gpu::prefill_tma`, Hopper, bf16 cache).
    fn build_kv_maps(&self) -> anyhow::Result<Option<DevBuf>> {
        if !self
            .gpu
            .has_function(&kernels::prefill_tma_kernel(&self.gpu, self.cfg.head_dim))
        {
            return Ok(None);
        }
        let caches: Vec<(u64, u64)> = (0..self.cfg.num_hidden_layers)
            .map(|l| (self.k_cache(l), self.v_cache(l)))
            .collect();
        kernels::kv_tensor_maps(
            &self.gpu,
            &caches,
            self.num_blocks,
            self.cfg.num_key_value_heads,
            self.opts.block_size,
            self.cfg.head_dim,
        )
        .map(Some)
    }

    /// Rows of the embedding and LM head on this GPU: the vocabulary, or a rank's slice of it.
    pub fn head_rows(&self) -> usize {
        self.tp
            .as_ref()
            .map_or(self.cfg.vocab_size, |tp| tp.head_rows)
    }

    fn limits(&self) -> Limits {
        Limits {
            max_tokens: self.max_tokens,
            max_seqs: self.max_seqs,
            max_rows: self.max_rows,
            max_blocks: self.max_blocks,
            num_sms: self.gpu.num_sms,
            num_heads: self.cfg.num_attention_heads,
            decode: self.decode_rule,
            prefill_split_kv: self.opts.prefill_split_kv,
            gemm_max_len: self.gemm_max_len,
            gemm_keys: self.gemm_keys,
            gemm_scores: self.gemm_scores,
            max_edits: self.max_seqs * MAX_EDITS_PER_ROW,
        }
    }

    /// Runs `batch` (after the block-table `updates`, (index, block id) pairs): packs and
    /// uploads its metadata, updates the tables, launches the forward (a decode graph when
    /// `graphs` allows and the step is pure decode). Sampling results or logits are read after.
    /// `counts`: the device holds the token counts of the batch's rows (the persistent batch,
    /// kept by `apply_count_ops`); a batch built by hand has none, so penalties are refused.
    /// A step launched ahead (lookahead) is left to finish unused.
    pub fn launch(
        &mut self,
        batch: &BatchInput,
        updates: &[(u32, u32)],
        graphs: bool,
        counts: bool,
    ) -> anyhow::Result<Step> {
        self.drop_ahead();
        self.launch_step(batch, updates, graphs, counts, false)
    }

    /// `launch` without the lookahead bookkeeping; `feed`: the input tokens of `batch` (one per
    /// sequence) are the last launch's samples, copied on the device after the upload.
    fn launch_step(
        &mut self,
        batch: &BatchInput,
        updates: &[(u32, u32)],
        graphs: bool,
        counts: bool,
        feed: bool,
    ) -> anyhow::Result<Step> {
        let lim = self.limits();
        let shape = step_meta::graph_shape(
            batch,
            &lim,
            graphs && self.opts.cuda_graphs,
            self.opts.verify_graphs,
        );
        // Only a predicted pure-decode step is fed (lookahead never predicts a verification).
        anyhow::ensure!(
            !feed || shape.is_none_or(|g| g.drafts == 0),
            "a fed step with drafts"
        );
        let step = step_meta::pack(&lim, batch, shape, updates, counts, &mut self.host)?;
        // One upload: the metadata holds the sampling arguments and logit edits too.
        let stage = match self.io.as_mut() {
            Some(io) => {
                let k = io.take()?;
                io.upload(k, &self.gpu, self.act.meta.ptr(), &self.host.meta)?;
                Some(k)
            }
            None => {
                self.gpu.upload(self.act.meta.ptr(), &self.host.meta)?;
                None
            }
        };
        if feed {
            let p = FeedTokensParams {
                sampled: self.act.out.ptr() + OUT_TOKENS as u64,
                tokens: self.act.meta.at::<u32>(step.layout.tokens),
                n: batch.seqs.len() as i32,
                vocab: self.cfg.vocab_size as i32,
            };
            // SAFETY: the last launch sampled at least as many rows as `batch` has sequences
            // (each of them), and its tokens section holds one per sequence.
            unsafe { kernels::feed_tokens(&self.gpu, &p)? };
        }
        if step.nu > 0 {
            let p = BlockTableUpdateParams {
                table: self.block_tables.ptr(),
                index: self.act.meta.at::<u32>(step.layout.table_index),
                value: self.act.meta.at::<u32>(step.layout.table_value),
                num_updates: step.nu as i32,
            };
            // SAFETY: pack() bounded every index by the table's rows and width.
            unsafe { kernels::block_table_update(&self.gpu, &p)? };
        }
        match shape {
            Some(g) => self.replay(g, &step, batch.seqs.len())?,
            // SAFETY: pack() checked the counts against the buffers; the metadata is uploaded.
            None => unsafe { self.enqueue(&step)? },
        }
        // The top log-probabilities are copied back only for a step that has rows asking.
        let top = wants_top(batch);
        if let (Some(io), Some(k)) = (self.io.as_mut(), stage) {
            io.download(k, &self.gpu, self.act.out.ptr(), out_bytes(step.ns, top))?;
        }
        self.cur = Some(Launched {
            stage,
            ns: step.ns,
            top,
        });
        Ok(step)
    }

    /// The tokens sampled by the last launch of `batch`, one per logit row in seq order (a
    /// sequence with drafts has `num_drafts + 1`, its draws at each position), and the top
    /// log-probabilities of the rows that asked; waits for them.
    pub fn sampled(
        &mut self,
        batch: &BatchInput,
    ) -> anyhow::Result<(Vec<SampledToken>, Vec<TopLogprobs>)> {
        let ns = batch.num_logit_rows();
        let cur = self.cur.context("no step was launched")?;
        self.tokens_host.resize(ns, 0);
        self.logprobs_host.resize(ns, 0.0);
        let top = wants_top(batch);
        anyhow::ensure!(
            cur.top || !top,
            "the step launched had no top log-probabilities"
        );
        let top_len = if top { ns * SAMPLE_MAX_TOP } else { 0 };
        self.top_ids_host.resize(top_len, -1);
        self.top_logprobs_host.resize(top_len, 0.0);
        // The first ns rows are the real sequences' (padding rows come after them).
        let words = match (cur.stage, self.io.as_ref()) {
            (Some(k), Some(io)) => io.wait(k)?,
            _ => {
                // One copy of the whole output buffer, pageable.
                self.out_host
                    .resize(out_bytes(cur.ns, cur.top).div_ceil(4), 0);
                self.gpu.download(&mut self.out_host, self.act.out.ptr())?;
                &self.out_host[..]
            }
        };
        let stamps = read_outputs(
            words,
            cur.ns,
            &mut self.tokens_host,
            &mut self.logprobs_host,
        );
        read_top(
            words,
            cur.ns,
            &mut self.top_ids_host,
            &mut self.top_logprobs_host,
        );
        self.last_stamps = self.opts.step_timing.then_some(stamps);
        let tops = io::collect_top(
            batch,
            &self.top_ids_host,
            &self.top_logprobs_host,
            self.cfg.vocab_size,
        );
        let vocab = self.cfg.vocab_size;
        if self.opts.lookahead {
            self.fed.clear();
            self.fed.extend(
                self.tokens_host
                    .iter()
                    .map(|&t| lookahead::fed_token(t, vocab)),
            );
        }
        let garbage_ok = self.opts.skip != 0;
        batch
            .seqs
            .iter()
            .filter(|q| q.sample.is_some())
            .flat_map(|q| std::iter::repeat_n(q, 1 + q.num_drafts))
            .zip(self.tokens_host.iter().zip(&self.logprobs_host))
            .map(|(q, (&token, &logprob))| {
                let mut token = token as u32;
                if token as usize >= vocab {
                    // NaN logits leave no argmax. With launches skipped (gpu-bench) the output
                    // is meaningless anyway; otherwise the token would be fed back next step.
                    anyhow::ensure!(
                        garbage_ok,
                        "{}: sampled token {token} is outside the vocabulary (non-finite logits?)",
                        q.request_id
                    );
                    token = vocab as u32 - 1;
                }
                Ok(SampledToken {
                    request_id: q.request_id,
                    token,
                    logprob,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()
            .map(|sampled| (sampled, tops))
    }

    /// Replaces the KV pool by one of `num_blocks` blocks (a draft model's pool, sized once the
    /// target's is known, before any step: graphs captured so far read the old pool).
    pub fn resize_kv(&mut self, num_blocks: usize) -> anyhow::Result<()> {
        anyhow::ensure!(num_blocks > 0, "a KV pool of no blocks");
        self.graphs.clear();
        let bytes_per_block =
            kv_bytes_per_block(&self.cfg, self.opts.block_size, self.opts.kv_cache_dtype);
        self.kv = self.gpu.alloc(0)?;
        self.kv = self.gpu.alloc(num_blocks * bytes_per_block)?;
        self.kv_layer_bytes = num_blocks * bytes_per_block / (2 * self.cfg.num_hidden_layers);
        self.num_blocks = num_blocks;
        self.kv_maps = self.build_kv_maps()?;
        Ok(())
    }

    /// The KV pool's layout, for block copies between the tiers (`cuda::kv_tier`).
    pub fn kv_layout(&self) -> super::kv_tier::KvLayout {
        let planes = 2 * self.cfg.num_hidden_layers;
        super::kv_tier::KvLayout {
            base: self.kv.ptr(),
            plane_stride: self.kv_layer_bytes,
            planes,
            plane_bytes: kv_bytes_per_block(
                &self.cfg,
                self.opts.block_size,
                self.opts.kv_cache_dtype,
            ) / planes,
            num_blocks: self.num_blocks,
        }
    }

    fn k_cache(&self, layer: usize) -> u64 {
        self.kv.ptr() + (2 * layer * self.kv_layer_bytes) as u64
    }

    fn v_cache(&self, layer: usize) -> u64 {
        self.k_cache(layer) + self.kv_layer_bytes as u64
    }
}

/// Bytes of one KV block across all layers, K and V, in the cache's dtype (bf16: 2 bytes an
/// element, fp8: 1).
pub fn kv_bytes_per_block(cfg: &ModelConfig, block_size: usize, dtype: KvCacheDtype) -> usize {
    2 * cfg.num_hidden_layers
        * cfg.num_key_value_heads
        * block_size
        * cfg.head_dim
        * dtype.cuda_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensor-core kernel's splits aim at 4 CTAs per SM (6 with an e4m3 cache); the lane
    /// kernel's at the option.
    #[test]
    fn decode_fill_caps_the_tensor_core_kernel() {
        let opts = CudaBackendOptions::default();
        assert_eq!(opts.decode_ctas_per_sm, 8);
        // Llama-3-8B (group 4): tensor cores, capped; Llama-2-7B (MHA): the lane kernel, as set,
        // with a bf16 cache, tensor cores with e4m3.
        assert_eq!(decode_fill(&opts, 128, 4, false), 4);
        assert_eq!(decode_fill(&opts, 128, 4, true), 6);
        assert_eq!(decode_fill(&opts, 128, 1, false), 8);
        assert_eq!(decode_fill(&opts, 128, 1, true), 6);
        // Head dims without a tensor-core kernel, or the lane kernel asked for: as set.
        assert_eq!(decode_fill(&opts, 256, 4, false), 8);
        let lanes = CudaBackendOptions {
            decode_kernel: DecodeKernel::Lanes,
            ..opts.clone()
        };
        assert_eq!(decode_fill(&lanes, 128, 4, false), 8);
        // Below the cap, or the older rule (0): unchanged.
        for c in [0, 2] {
            let o = CudaBackendOptions {
                decode_ctas_per_sm: c,
                ..opts.clone()
            };
            assert_eq!(decode_fill(&o, 128, 4, false), c);
        }
    }
}
