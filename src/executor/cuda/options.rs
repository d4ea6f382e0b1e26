//! `CudaBackendOptions`: how the CUDA backend is sized and which paths it takes. Apart from
//! `backend` so that `forward`, which `backend` drives, can read them without a cycle.

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
    /// Also replay speculative verification steps from CUDA graphs (with `cuda_graphs`): a
    /// step whose every sequence verifies the same number of drafts k, padded to a batch-size
    /// bucket, keyed by (bucket, k) (`step_meta::graph_shape`). Off by default until measured
    /// on the H200 (`gpu-bench spec`, variant verify-graphs).
    pub verify_graphs: bool,
    /// Linear layers of at most this many rows run on brook's `gemv` kernel instead of cuBLAS
    /// (0: always cuBLAS; at most `kernels::GEMV_MAX_M`).
    pub gemv_max_rows: usize,
    /// Warps per output row of every gemv (1, 2, 4 or 8); 0 (default): chosen per shape by
    /// `kernels::gemv_split`. For benchmarks.
    pub gemv_split: usize,
    /// Decode GEMVs (the gemv path's rows) on the bulk-copy kernel (kernels/gemv_bulk.cu, sm_90+):
    /// one CTA an SM streams a slab of whole rows through a shared-memory ring, filled before
    /// the previous kernel ends. Shapes it does not take run the `gemv` kernel.
    pub gemv_bulk: bool,
    /// The shared memory each bulk gemv launch asks for (`GemvSmem`, `Gpu::gemv_smem`).
    pub gemv_smem: GemvSmem,
    /// On the gemv path, fuse RoPE + the K/V write into the QKV projection and SiLU × up into
    /// the gate|up projection (two launches fewer per layer). Off by default: on the H200 the
    /// fused kernels measured 0.17 ms/token slower at batch 1 (BENCHMARKS.md, call f).
    pub fuse_decode: bool,
    /// Programmatic dependent launch where the GPU has it (sm_90+): GEMVs and norms start while
    /// the kernel before them drains, streaming their weights early.
    pub pdl: bool,
    /// With `pdl`, also launch these of `rope_kv`, `silu_mul` (at most
    /// `kernels::PDL_SILU_MAX_ROWS` rows) and `sample` with it (bits of `pdl_small`;
    /// `Gpu::pdl_small`): they wait in the kernel for the projection before them instead of being
    /// launched once it has ended. SiLU by default (measured).
    pub pdl_small: u32,
    /// Prefill sequences whose context (cached prefix + chunk) has at most this many tokens run
    /// attention as cuBLAS GEMMs with a causal softmax kernel; longer ones on the flash kernel
    /// (0: flash only). Its scratch is sized at start; a step's GEMM sequences that do not fit
    /// it go to the flash kernel. The crossover is measured by `gpu-bench prefill-attn`.
    pub prefill_gemm_max_len: usize,
    /// Page-locked host staging for each step's metadata upload and its sampled tokens (one
    /// async copy up, `copy_out` back, double-buffered), and a wait on the step's event instead
    /// of the stream. Off by default: alone it ties the pageable path (the same GPU time a
    /// step, BENCHMARKS.md session 31); lookahead needs it.
    pub pinned_io: bool,
    /// Lookahead decode (implies `pinned_io`): after launching a step in which every sequence
    /// samples, launch the pure-decode step expected to follow it (each sequence decoding the
    /// token it samples now, fed on the device by `feed_tokens`) before waiting for this one, so
    /// the GPU never waits on the host's round trip through the scheduler. The next `execute`
    /// keeps it when its plan is exactly that step, and otherwise lets it finish unused (one
    /// wasted step: a request that ends, one that joins, a new block). On by default, gated
    /// (`LookaheadMode::Auto`).
    pub lookahead: bool,
    /// With `lookahead`: None launches every step it predicts (`model.cuda_lookahead = "on"`);
    /// Some(gain µs) only while `lookahead::Gate`, weighing that gain per kept step against
    /// the GPU time of unused ones, is open ("auto"). Predictions it holds back are still
    /// checked against the next plan (host work), so it opens again when churn dies down.
    pub lookahead_gate_us: Option<f64>,
    /// Decode attention split rule: 0, `kernels::decode_splits` (about 2 CTAs per SM, up to 32
    /// splits); otherwise `kernels::decode_splits_filled` with this many CTAs per SM (up to 64
    /// splits, powers of two; serving default 8).
    pub decode_ctas_per_sm: usize,
    /// Which decode attention kernel runs (`DecodeKernel`, `model.decode_attention`); `Auto` by
    /// default.
    pub decode_kernel: DecodeKernel,
    /// Merge decode attention's splits inside the decode kernel (the last CTA of each head
    /// merges; one launch) instead of in `paged_decode_reduce`. On by default (measured).
    pub decode_merge_inline: bool,
    /// Run the splits of each decode (item, kv head slice) as one thread-block cluster that
    /// merges them in distributed shared memory (sm_90; at most `kernels::DECODE_CLUSTER_MAX`
    /// splits, to which the split rule is then capped), where the grid fills at most half a wave
    /// of the kernel (`Limits::decode_splits`); elsewhere the other merges. On by default
    /// (measured).
    pub decode_cluster: bool,
    /// The fewest keys a decode split takes under the filled split rule (at least
    /// `kernels::MIN_SPLIT_KEYS`, which sizes the split scratch); 0: the rule's own
    /// (`kernels::decode_min_split_keys`). For benchmarks.
    pub decode_min_split_keys: usize,
    /// Extra `-D` defines for the decode attention builds (`Gpu::decode_defines`): the
    /// `DMMA_*` overrides kernels/paged_decode_mma.cu documents. Empty by default. For
    /// benchmarks.
    pub decode_defines: Vec<(String, usize)>,
    /// Prefill attention on the wgmma kernel where it is built (Hopper, head dim 64 or 128;
    /// kernels/prefill_attn_wgmma.cu); false: the mma.sync kernel. On by default.
    pub prefill_wgmma: bool,
    /// K/V tiles of the wgmma prefill kernel over a bf16 cache (`Gpu::prefill_wg_stages`): 1
    /// or 2 (`compile::PREFILL_WG_STAGES` by default).
    pub prefill_wg_stages: usize,
    /// The wgmma prefill kernel over a bf16 cache loads K/V tiles by TMA through tensor maps of
    /// the cache (`Gpu::prefill_tma`; its WG_TMA build) instead of cp.async.
    pub prefill_tma: bool,
    /// The gate|up projection writes bf16 (as HF transformers and vLLM compute it) instead of
    /// fp32, and `silu_mul` reads bf16: half the bytes of a prefill's largest activation,
    /// written by the GEMM and read back by the SiLU.
    pub gate_up_bf16: bool,
    /// Split flash prefill attention over the keys when a step's query tiles x heads do not
    /// fill the GPU (short chunks at long context; `kernels::prefill_splits`). On by default.
    pub prefill_split_kv: bool,
    /// Linear layers on cuBLAS (more rows than the gemv kernels take: prefill, large decode
    /// steps) with bf16 weights: the o and down projections add into the fp32 residual in
    /// their epilogue (`gemm::linear_add`), and the norm after each reads the residual alone,
    /// instead of a bf16 delta written and read back (`add_rmsnorm`'s residual += delta). Also
    /// skips rounding the delta to bf16 before the add.
    pub residual_gemm: bool,
    /// Before the backend is returned, run a prefill of up to 2048 dummy tokens and a decode
    /// step at every decode-graph bucket on blocks no request holds yet (`CudaBackend::warm_up`):
    /// the first use of cuBLAS and the kernels and the buckets' graph captures happen at start,
    /// not in the first requests. A failure is logged and serving goes on.
    pub warm_up: bool,
    /// gpu-bench: stamp the GPU's global timer at the start and end of each step's kernels
    /// (two one-thread launches inside the step) and time the host's phases; read with
    /// `CudaBackend::last_timing`.
    pub step_timing: bool,
    pub progress: bool,
    /// KV host tier in pinned host memory, bytes (0: none; `executor::cuda::kv_tier`).
    pub host_kv_cache_bytes: usize,
    /// Sample only ids below this (0: the whole vocabulary): a synthetic model served with a
    /// tokenizer smaller than its shape's vocabulary emits only ids the tokenizer can decode.
    pub sample_vocab_size: usize,
    /// Speculative decoding: most draft tokens a sequence verifies in one step (0: none). The
    /// sampler's buffers are sized for `1 + max_drafts` logit rows per sequence.
    pub max_drafts: usize,
    /// gpu-bench only: kinds of launch left out of each layer (`skip::*` bits), to time what
    /// each costs inside a step (decode or prefill); the step's output is then meaningless. 0
    /// otherwise.
    pub skip: u32,
    /// The paged KV cache's element type (`--kv-cache-dtype`).
    pub kv_cache_dtype: KvCacheDtype,
    /// How the layers' linear weights are held (`--quantization`).
    pub quantization: Quantization,
}

/// Lookahead decode as `brook serve` offers it (`model.cuda_lookahead`, `--cuda-lookahead`):
/// off; on (every predicted step launched ahead: `CudaBackendOptions::lookahead`); auto
/// (launched only while `lookahead::Gate` finds that it pays: `lookahead_gate_us`). Auto by
/// default: under serving churn a wrong prediction wastes a whole step against ~20 µs gained
/// by a kept one, so "on" lost up to 2.6 % simulated while "auto" stayed within 0.02 % of off
/// (`brook simulate --lookahead`, BENCHMARKS.md session 32); on an H100 "auto" kept every step
/// at steady batch 1 (session 33) and served batch 512 slightly faster (session 34).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LookaheadMode {
    Off,
    On,
    #[default]
    Auto,
}

/// The decode attention kernel (paged_decode.cu). `Lanes`: fp32 dot products on the CUDA cores,
/// lanes sharing a key; `Mma`: tensor cores, the query heads of a kv head as the mma's columns
/// (paged_decode_mma.cu; head dims up to 128); `Auto`: `kernels::decode_kernel`'s rule by shape
/// and cache dtype, measured on the H200 (`gpu-bench attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DecodeKernel {
    #[default]
    Auto,
    Lanes,
    Mma,
}

impl DecodeKernel {
    pub fn as_str(self) -> &'static str {
        match self {
            DecodeKernel::Auto => "auto",
            DecodeKernel::Lanes => "lanes",
            DecodeKernel::Mma => "mma",
        }
    }
}

/// The shared memory each bulk gemv launch asks for (kernels/gemv_bulk.cu). A CTA can only start
/// on an SM once the CTAs there leave it room, and a launch's weights start streaming only when
/// its CTAs are on the SMs. `Roomy`: room for the largest x and accumulator (~224 KB: a CTA has
/// its SM to itself). `Tight`: the ring (32 stages, 128 KB), this launch's x and its
/// CTA's accumulator (~140-150 KB for Llama-sized rows): the O projection's CTAs start beside
/// decode attention's as those leave room, not once the last has left. Measured on an H100
/// (BENCHMARKS.md, session 39): batch 2-4 at 4k 0.5-1.0 % faster (Llama-3-8B batch 4 tied),
/// batch 1 tied. `Deep` (default): at one row, a ring of 48 stages (192 KB) with the launch's x
/// and accumulator where they fit beside it (Llama-sized k), else as `Tight`. At a kernel
/// boundary the ring is full before x is staged and no CTA consumes for 4-7 µs (session 40's
/// stamps), so a deeper ring keeps the weights streaming through more of that gap. Measured on
/// three H100s (session 41): batch-1 decode 0.6-1.7 % faster; at two rows it lost ~0.5 %, so
/// two rows and more stay tight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GemvSmem {
    Roomy,
    Tight,
    #[default]
    Deep,
}

impl GemvSmem {
    pub fn as_str(self) -> &'static str {
        match self {
            GemvSmem::Roomy => "roomy",
            GemvSmem::Tight => "tight",
            GemvSmem::Deep => "deep",
        }
    }
}

/// The linear layers' weights, as vLLM's `--quantization`. `None`: bf16. `Fp8`: the q/k/v, o,
/// gate/up and down weights quantized at load to e4m3 with one f32 scale per matrix (the
/// embedding, norms and LM head stay bf16); decode's few rows run `gemv_fp8` (half the bytes a
/// step streams), more rows are quantized per call (a dynamic per-tensor scale) and run fp8
/// tensor-core GEMMs through cuBLASLt. CUDA only, sm_89+.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Quantization {
    #[default]
    None,
    Fp8,
}

impl Quantization {
    pub fn is_fp8(self) -> bool {
        self == Quantization::Fp8
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Quantization::None => "none",
            Quantization::Fp8 => "fp8",
        }
    }
}

/// The KV cache's element type, as vLLM's `--kv-cache-dtype`. `Auto` is the model's dtype
/// (bf16 on the CUDA executor; the CPU executor's own). `Fp8` stores K and V as e4m3 with a
/// per-tensor scale of 1 (no calibration; values saturate at ±448): half the bytes a token, so
/// twice the tokens in the pool and half the K/V reads of a decode step. CUDA only, sm_89+.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    #[default]
    Auto,
    Bf16,
    Fp8,
}

impl KvCacheDtype {
    pub fn is_fp8(self) -> bool {
        self == KvCacheDtype::Fp8
    }

    /// Bytes of one cached K or V element on the CUDA executor.
    pub fn cuda_bytes(self) -> usize {
        match self {
            KvCacheDtype::Auto | KvCacheDtype::Bf16 => 2,
            KvCacheDtype::Fp8 => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::Fp8 => "fp8",
        }
    }
}

impl CudaBackendOptions {
    /// Ids sampled from a model of `vocab_size`: `sample_vocab_size` when set and smaller.
    pub fn sampled_vocab(&self, vocab_size: usize) -> usize {
        match self.sample_vocab_size {
            0 => vocab_size,
            n => n.min(vocab_size),
        }
    }
}

/// Bits of `CudaBackendOptions::pdl_small`: the element-wise kernels launched with PDL.
pub mod pdl_small {
    pub const ROPE: u32 = 1;
    pub const SILU: u32 = 2;
    pub const SAMPLE: u32 = 4;
    pub const ALL: u32 = ROPE | SILU | SAMPLE;
}

/// Bits of `CudaBackendOptions::skip`.
pub mod skip {
    pub const NORMS: u32 = 1;
    pub const ROPE: u32 = 2;
    /// Decode and prefill attention (flash tiles and the GEMM path).
    pub const ATTENTION: u32 = 4;
    pub const SILU: u32 = 8;
    /// The layers' linear projections (not the LM head).
    pub const LINEAR: u32 = 16;
    /// The final norm and the LM head (the logits keep whatever they held).
    pub const HEAD: u32 = 32;
    /// Sampling (the tokens copied back are stale).
    pub const SAMPLE: u32 = 64;
}
