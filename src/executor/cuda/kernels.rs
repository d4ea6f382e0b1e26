//! Parameter structs of `kernels/*.cu` (field for field, `#[repr(C)]`) and their launches.
//! Pointers are raw device addresses (`u64`); shapes are in the .cu files' comments.
//!
//! Over 600 lines on purpose: one mirror struct and one launch per kernel, all alike and
//! checked together against the C layout (`param_structs_match_the_c_layout`); the
//! step-pipeline kernels and the filled decode split rule are in `kernels/step_io.rs`.

use anyhow::Context;

use super::device::{DevBuf, Gpu};
use super::options::{pdl_small, DecodeKernel};

mod gemv_bulk;
mod gemv_chain;
mod kv_stage;
mod step_io;
pub use gemv_bulk::*;
pub use gemv_chain::*;
pub use kv_stage::*;
pub use step_io::*;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EmbeddingParams {
    pub table: u64,
    pub tokens: u64,
    pub out: u64,
    pub num_tokens: i32,
    pub d: i32,
    /// The table's first row's token id (tensor parallelism's vocabulary slice; else 0).
    pub vocab_start: u32,
    /// The table's rows: tokens outside [vocab_start, vocab_start + vocab_rows) give zero rows.
    pub vocab_rows: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AddRmsNormParams {
    pub residual: u64,
    /// 0: normalise only.
    pub delta: u64,
    pub weight: u64,
    /// 0: row i is residual row i.
    pub rows: u64,
    pub out: u64,
    pub num_rows: i32,
    pub d: i32,
    pub eps: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RopeKvParams {
    pub qkv: u64,
    pub positions: u64,
    pub slots: u64,
    pub inv_freq: u64,
    /// 0: no q/k/v bias.
    pub qkv_bias: u64,
    /// 0: no q/k head norm (then `k_norm` is 0 too).
    pub q_norm: u64,
    pub k_norm: u64,
    pub q_out: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub num_tokens: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub block_size: i32,
    pub eps: f32,
    /// Factor on cos and sin (longrope's attention factor; 1 otherwise).
    pub rope_scale: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SiluMulParams {
    pub gate_up: u64,
    pub out: u64,
    pub num_tokens: i32,
    pub inter: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PagedDecodeParams {
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub item_row: u64,
    pub item_seq: u64,
    pub block_tables: u64,
    pub context_lens: u64,
    pub out: u64,
    pub part_acc: u64,
    pub part_ml: u64,
    /// `[num_items, num_kv_heads * decode_group_ctas]` arrival counters, zero between launches:
    /// the splits are merged inside `paged_decode` by the last CTA of each (item, kv head slice).
    /// 0: merged by the `paged_decode_reduce` launch.
    pub counters: u64,
    pub num_items: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub block_size: i32,
    pub max_blocks: i32,
    pub num_splits: i32,
    /// Sliding window in keys; 0: the whole context.
    pub window: i32,
    pub scale: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PrefillAttnParams {
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub tile_seq: u64,
    pub tile_q0: u64,
    pub q_start: u64,
    pub q_len: u64,
    pub context_lens: u64,
    pub block_tables: u64,
    pub out: u64,
    /// Split partials, `[num_tiles, num_heads, num_splits, PREFILL_TILE, head_dim]` f32 and
    /// `[.., PREFILL_TILE, 2]` (max, sum); read only when `num_splits > 1` (`PrefillSplitScratch`).
    pub part_acc: u64,
    pub part_ml: u64,
    /// `[num_tiles, num_heads]` arrival counters, zero between launches (the last CTA resets).
    pub counters: u64,
    pub num_tiles: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub block_size: i32,
    pub max_blocks: i32,
    /// Sliding window in keys; 0: the whole context.
    pub window: i32,
    /// CTAs per (tile, head) over its keys (`prefill_splits`); 1: no partials.
    pub num_splits: i32,
    pub scale: f32,
    /// This layer's K and V tensor maps (`kv_tensor_maps`, 2 x 128 bytes on the device): the
    /// wgmma kernel's TMA build loads the tiles through them (`prefill_attn`); 0: none.
    pub kv_maps: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvGatherParams {
    pub k_cache: u64,
    pub v_cache: u64,
    pub gemm_seq: u64,
    pub gemm_key0: u64,
    pub context_lens: u64,
    pub block_tables: u64,
    pub k_out: u64,
    pub v_out: u64,
    pub num_gemm: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub block_size: i32,
    pub max_blocks: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CausalSoftmaxParams {
    pub scores: u64,
    /// May equal `scores` (in place).
    pub probs: u64,
    pub gemm_seq: u64,
    pub gemm_s0: u64,
    pub q_len: u64,
    pub context_lens: u64,
    pub num_gemm: i32,
    pub num_heads: i32,
    pub scale: f32,
}

/// Keys per CTA of `kv_gather` (`GATHER_KEYS` in kv_gather.cu).
const GATHER_KEYS: usize = 32;
/// Rows (one warp each) per CTA of `causal_softmax` (`SOFTMAX_ROWS` in causal_softmax.cu).
const SOFTMAX_ROWS: usize = 4;

/// Floats between rows of the GEMM path's scores for a context of `ctx` keys (`scores_ld` in
/// causal_softmax.cu): a multiple of 8, so rows of S (fp32) and of P (bf16) start 16-byte aligned.
pub fn scores_ld(ctx: usize) -> usize {
    ctx.next_multiple_of(8)
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvParams {
    pub x: u64,
    pub w: u64,
    /// 0 when `y32` is set.
    pub y: u64,
    /// 0 for a bf16 output.
    pub y32: u64,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    /// Warps per output row (split-K inside the CTA): `gemv_split`.
    pub split: i32,
    /// `gemv_fp8`: the e4m3 weight's f32 scale; 0 (unused) for bf16 weights.
    pub w_scale: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AmaxScaleParams {
    pub x: u64,
    pub partial: u64,
    pub counter: u64,
    pub scale: u64,
    pub n: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QuantScaledParams {
    pub x: u64,
    pub q: u64,
    pub scale: u64,
    pub n: i64,
}

/// Threads of a quant_fp8.cu CTA (`QUANT_THREADS`).
const QUANT_THREADS: u32 = 256;

/// Most CTAs of a quant_fp8.cu launch (grid-stride beyond): the length of `partial`.
pub const AMAX_MAX_CTAS: usize = 1024;

/// A bf16 tensor to e4m3 with one scale (kernels/quant_fp8.cu): weights at load, activations
/// before an fp8 GEMM.
#[derive(Debug, Clone, Copy)]
pub struct QuantizeE4m3 {
    /// `[n]` bf16, n % 8 == 0.
    pub x: u64,
    /// `[n]` e4m3 out.
    pub q: u64,
    /// `[2]` f32 out: the scale s (x ≈ q · s) and 1 / s.
    pub scale: u64,
    /// `[AMAX_MAX_CTAS]` f32 scratch, and a u32 arrival counter that is zero between launches.
    pub partial: u64,
    pub counter: u64,
    pub n: usize,
}

/// `amax_scale` then `quant_scaled`. Needs sm_89+ (`Gpu::check_fp8`).
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape documented on its field.
pub unsafe fn quantize_e4m3(gpu: &Gpu, p: &QuantizeE4m3) -> anyhow::Result<()> {
    anyhow::ensure!(
        p.n > 0 && p.n % 8 == 0,
        "e4m3 quantization needs a non-empty tensor of n % 8 == 0; got {}",
        p.n
    );
    let ctas = p.n.div_ceil(8 * QUANT_THREADS as usize).min(AMAX_MAX_CTAS) as u32;
    let block = (QUANT_THREADS, 1, 1);
    let amax = AmaxScaleParams {
        x: p.x,
        partial: p.partial,
        counter: p.counter,
        scale: p.scale,
        n: p.n as i64,
    };
    gpu.launch("amax_scale", (ctas, 1, 1), block, &amax)?;
    let quant = QuantScaledParams {
        x: p.x,
        q: p.q,
        scale: p.scale,
        n: p.n as i64,
    };
    gpu.launch("quant_scaled", (ctas, 1, 1), block, &quant)
}

pub use super::compile::{attention_supported, GEMV_MAX_M};

/// Warps per CTA of the gemv kernels (`GEMV_WARPS` in gemv.cu), `split` of them per output row.
pub const GEMV_WARPS: u32 = 8;
/// 16-byte weight loads per lane per buffer of the gemv kernels (`GEMV_UNROLL` in gemv.cu).
pub const GEMV_UNROLL: usize = 2;
/// Warps per output row for a gemv over rows of `k` elements: `gpu.gemv_split` when set, else 1,
/// or 4 for rows of 8192 elements and more. On the H200 (gpu-bench, call 2026-12-02h) the long
/// rows of the down projection (k = 11008, 14336) streamed fastest at 4 warps a row (27.3 us
/// against 28.5 at 1 for Llama-2-7B, alone); for k <= 4096 splitting gained up to 4 % alone but
/// lost ~1 % of the whole decode step inside the graph (split 2 or 4 everywhere: 4.06–4.07
/// ms/token, split 1: 3.96). The rule is about a row's bytes: `gemv_fp8`'s e4m3 rows count as
/// `k / 2` (session 16, fp8 decode: split 1 everywhere 2.44 ms/token, this rule on `k` 2.52).
pub fn gemv_split(gpu: &Gpu, k: usize) -> i32 {
    match gpu.gemv_split {
        0 => default_gemv_split(k),
        s => s as i32,
    }
}

fn default_gemv_split(k: usize) -> i32 {
    if k >= 8192 {
        4
    } else {
        1
    }
}

/// Grid of a gemv launch over `rows` rows (pairs): GEMV_WARPS / split of them per CTA.
fn gemv_grid(rows: i32, split: i32) -> (u32, u32, u32) {
    let per_cta = GEMV_WARPS / split as u32;
    ((rows as u32).div_ceil(per_cta), 1, 1)
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvSiluParams {
    pub x: u64,
    pub w: u64,
    pub out: u64,
    pub m: i32,
    pub inter: i32,
    pub k: i32,
    /// Warps per output (row pair): `gemv_split`.
    pub split: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvQkvRopeParams {
    pub x: u64,
    pub w: u64,
    pub positions: u64,
    pub slots: u64,
    pub inv_freq: u64,
    pub q_out: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub m: i32,
    pub k: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub block_size: i32,
    /// Warps per row pair: `gemv_split`.
    pub split: i32,
}

/// Query rows per prefill-attention CTA (`PF_BM` in prefill_attn.cu).
pub const PREFILL_TILE: usize = 64;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockTableUpdateParams {
    pub table: u64,
    pub index: u64,
    pub value: u64,
    pub num_updates: i32,
}

/// One sampled sequence's parameters (`SampleArgs` in sample.cu). The default is a greedy row
/// with nothing else (graph padding).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SampleArgs {
    pub seed: u64,
    pub output_index: u64,
    pub temperature: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub top_k: i32,
    pub presence: f32,
    pub frequency: f32,
    pub repetition: f32,
    /// Row of the token counts (penalties), or -1.
    pub counts_row: i32,
    pub edit_start: i32,
    pub num_edits: i32,
    pub num_logprobs: i32,
    pub pad: i32,
}

impl Default for SampleArgs {
    fn default() -> Self {
        SampleArgs {
            seed: 0,
            output_index: 0,
            temperature: 0.0,
            top_p: 1.0,
            min_p: 0.0,
            top_k: 0,
            presence: 0.0,
            frequency: 0.0,
            repetition: 1.0,
            counts_row: -1,
            edit_start: 0,
            num_edits: 0,
            num_logprobs: 0,
            pad: 0,
        }
    }
}

/// A logit edit (`SampleEdit` in sample.cu): `value` added to `token`'s logit; -inf masks it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SampleEdit {
    pub token: i32,
    pub value: f32,
}

/// Top log-probabilities the kernel writes per row at most (`SAMPLE_MAX_TOP`).
pub const SAMPLE_MAX_TOP: usize = 20;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SampleParams {
    pub logits: u64,
    pub args: u64,
    pub tokens: u64,
    pub logprobs: u64,
    pub edits: u64,
    pub counts: u64,
    pub work: u64,
    pub top_ids: u64,
    pub top_logprobs: u64,
    pub num_rows: i32,
    /// Ids sampled: the first `vocab` logits of each row.
    pub vocab: i32,
    /// Logits per row, >= `vocab`.
    pub stride: i32,
}

/// `delta` that sets a count's prompt bit (`COUNT_PROMPT` in sample.cu).
pub const COUNT_PROMPT: i32 = i32::MIN;

/// One change to the token counts (`CountUpdate` in sample.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountUpdate {
    /// row · vocab + token.
    pub index: u32,
    /// Added to the output count, or `COUNT_PROMPT`.
    pub delta: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SampleCountsUpdateParams {
    pub counts: u64,
    pub updates: u64,
    pub num_updates: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SampleCountsMoveParams {
    pub counts: u64,
    pub from: i32,
    pub to: i32,
    pub vocab: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FillParams {
    pub out: u64,
    pub n: u64,
    pub seed: u64,
    pub scale: f32,
    pub offset: f32,
}

const SAMPLE_THREADS: u32 = 1024;
const DECODE_THREADS: u32 = 128;

/// Most query heads one decode CTA serves (`DECODE_GC_MAX` in paged_decode.cu): 8, 4 with an
/// e4m3 cache (a lane holds twice the dims of each head).
const DECODE_GC_MAX: usize = 8;
const DECODE_GC_MAX_FP8: usize = 4;

/// CTAs per kv head of the bf16-cache decode kernel (`DECODE_GROUP_CTAS`): groups over 8 heads
/// are cut in equal slices.
pub fn decode_group_ctas(group: usize) -> usize {
    decode_group_ctas_for(group, false)
}

/// `decode_group_ctas` for a cache of either dtype (`kv_fp8`: e4m3, slices of at most 4 heads).
pub fn decode_group_ctas_for(group: usize, kv_fp8: bool) -> usize {
    group.div_ceil(match kv_fp8 {
        true => DECODE_GC_MAX_FP8,
        false => DECODE_GC_MAX,
    })
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn embedding(gpu: &Gpu, p: &EmbeddingParams) -> anyhow::Result<()> {
    gpu.launch("embedding", (p.num_tokens as u32, 1, 1), (256, 1, 1), p)
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn add_rmsnorm(gpu: &Gpu, p: &AddRmsNormParams) -> anyhow::Result<()> {
    anyhow::ensure!(
        p.d <= 256 * 32 && p.d % 8 == 0,
        "add_rmsnorm handles hidden sizes up to 8192 that are a multiple of 8, got {}",
        p.d
    );
    gpu.launch_pdl("add_rmsnorm", (p.num_rows as u32, 1, 1), (256, 1, 1), p)
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn rope_kv(gpu: &Gpu, p: &RopeKvParams) -> anyhow::Result<()> {
    let (head_dim, heads) = (p.head_dim as u32, (p.num_heads + p.num_kv_heads) as u32);
    anyhow::ensure!(
        head_dim % 8 == 0 && head_dim / 8 <= ROPE_MAX_THREADS,
        "rope_kv: head_dim {head_dim} (a multiple of 8, at most {})",
        8 * ROPE_MAX_THREADS
    );
    // head_dim / 8 threads a head (4 rotated pairs each), as many heads a CTA as fit.
    let per_head = head_dim / 8;
    let hpc = (ROPE_MAX_THREADS / per_head).min(heads).max(1);
    gpu.launch_small(
        pdl_small::ROPE,
        &gpu.kv_kernel("rope_kv"),
        (p.num_tokens as u32, heads.div_ceil(hpc), 1),
        (hpc * per_head, 1, 1),
        p,
    )
}

/// Most threads a `rope_kv` CTA has (ROPE_MAX_THREADS in rope_kv.cu).
pub const ROPE_MAX_THREADS: u32 = 128;

/// SiLU(gate) × up from the gate|up GEMM's output: fp32, or bf16 when `bf16_in`
/// (`silu_mul_bf16`; `CudaBackendOptions::gate_up_bf16`).
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn silu_mul(gpu: &Gpu, p: &SiluMulParams, bf16_in: bool) -> anyhow::Result<()> {
    // Four outputs a thread (silu_mul.cu).
    // With PDL at 1-2 rows only: a batch-4 step was 2.5-5 % slower with it, batches 1 and 2
    // 0.5-2 % faster (BENCHMARKS.md, session 37).
    let bit = match p.num_tokens <= PDL_SILU_MAX_ROWS {
        true => pdl_small::SILU,
        false => 0,
    };
    gpu.launch_small(
        bit,
        if bf16_in { "silu_mul_bf16" } else { "silu_mul" },
        ((p.inter as u32).div_ceil(4 * 256), p.num_tokens as u32, 1),
        (256, 1, 1),
        p,
    )
}

/// Most rows (tokens) of a `silu_mul` launched with PDL (`pdl_small::SILU`).
pub const PDL_SILU_MAX_ROWS: i32 = 2;

/// Query heads a tensor-core decode CTA serves (`DMMA_HEADS` in paged_decode_mma.cu): larger
/// groups are cut in equal slices.
const DECODE_MMA_HEADS: usize = 8;

/// CTAs per kv head of the tensor-core decode kernel (`DMMA_GROUP_CTAS`); never more than
/// `decode_group_ctas_for` (the arrival counters are sized by that).
pub fn decode_mma_group_ctas(group: usize) -> usize {
    group.div_ceil(DECODE_MMA_HEADS)
}

/// Whether paged_decode_mma.cu has a kernel for this head dim and cache dtype (its `#if`).
pub fn decode_mma_supported(head_dim: usize, kv_fp8: bool) -> bool {
    let elem = if kv_fp8 { 1 } else { 2 };
    head_dim % 16 == 0 && head_dim <= 128 && (head_dim / 8 * elem) % 4 == 0
}

/// The decode attention kernel that runs for `choice` (`Auto`: by shape): `Lanes` or `Mma`.
/// `Mma` where the shape has no tensor-core kernel falls back to `Lanes`.
pub fn decode_kernel(
    choice: DecodeKernel,
    head_dim: usize,
    group: usize,
    kv_fp8: bool,
) -> DecodeKernel {
    if !decode_mma_supported(head_dim, kv_fp8) {
        return DecodeKernel::Lanes;
    }
    match choice {
        // The lane kernel spends `group` fp32 FMAs on every cached element, and a widening on
        // each e4m3 byte: with GQA or an e4m3 cache that outgrows what the SM issues while the
        // bytes stream in. On the H200 (`gpu-bench attention`, session 18 call 4, summed over
        // 11-12 (context, batch) cases a shape) the tensor-core kernel took 44 % of the lane
        // kernel's time on Llama-3-8B's heads in bf16 (94-104 % of the copy bandwidth at batch
        // 64-256) and 39 % in e4m3, on Qwen2.5-7B's 31 and 22 %; with MHA it took 91 % (e4m3)
        // and 69 % (Phi-3's head dim 96, e4m3), and in bf16 the two were even (within 1 %), the
        // lane kernel ahead at batch 1-16 and 1k keys (23 against 20 %, 82 against 73 %): there
        // it stays.
        DecodeKernel::Auto if group >= 2 || kv_fp8 => DecodeKernel::Mma,
        DecodeKernel::Auto => DecodeKernel::Lanes,
        c => c,
    }
}

/// Fewest keys a decode split gets (`decode_splits_filled`) on `kernel` (resolved by
/// `decode_kernel`) when the batch's longest context is `max_context`: 32, but 128 on tensor
/// cores from 1k keys. A tensor-core CTA loads 128 keys a round (4 warps, 2 steps of 16), and on
/// the H200 (session 18, call 8, batch 1) splits of 128 keys made Llama-3-8B's decode step 6 %
/// faster at 3.8k and 7.9k tokens (4.744 → 4.470 ms, 4.940 → 4.646 in bf16; e4m3 alike) and the
/// kernel alone 18-25 % faster at 1k and 4k; at 128-384 tokens, where 32-key splits give 4-8
/// times the CTAs, the step was 3 % slower with them (4.253 → 4.381 ms).
pub fn decode_min_split_keys(kernel: DecodeKernel, max_context: usize) -> usize {
    match kernel {
        DecodeKernel::Mma if max_context >= 1024 => 128,
        _ => MIN_SPLIT_KEYS,
    }
}

/// The fewest keys `decode_min_split_keys` gives a split under any kernel and context: the split
/// scratch is sized by it (more keys a split, fewer splits).
pub const MIN_SPLIT_KEYS: usize = 32;

/// Most decode splits merged in one thread-block cluster (`DECODE_CLUSTER_MAX` in
/// paged_decode.cu): the largest cluster sm_90 launches, a non-portable size the decode kernels
/// are allowed (`Gpu::load_attention`).
pub const DECODE_CLUSTER_MAX: usize = 16;

/// Whether `gpu` can merge decode splits in a cluster (`paged_decode` with `cluster`): sm_90+.
pub fn decode_cluster_supported(gpu: &Gpu) -> bool {
    gpu.compute_capability.0 >= 9
}

/// The decode kernel `kernel` (resolved by `decode_kernel`) at this shape: its loaded name and
/// its CTAs per kv head.
fn decode_kernel_of(
    gpu: &Gpu,
    kernel: DecodeKernel,
    head_dim: usize,
    group: usize,
) -> anyhow::Result<(String, usize)> {
    let (kernel_name, slices) = match decode_kernel(kernel, head_dim, group, gpu.kv_fp8()) {
        DecodeKernel::Mma => ("paged_decode_mma", decode_mma_group_ctas(group)),
        _ => ("paged_decode", decode_group_ctas_for(group, gpu.kv_fp8())),
    };
    let name = attention_kernel(
        gpu,
        gpu.kv_kernel(&format!("{kernel_name}_hd{head_dim}_g{group}")),
    )?;
    Ok((name, slices))
}

/// One wave of decode kernel `kernel` at this shape (its resident CTAs an SM × the SMs) and its
/// CTAs per kv head: what `DecodeSplitRule::splits` weighs a cluster merge by.
pub fn decode_wave(
    gpu: &Gpu,
    kernel: DecodeKernel,
    head_dim: usize,
    group: usize,
) -> anyhow::Result<(usize, usize)> {
    let (name, slices) = decode_kernel_of(gpu, kernel, head_dim, group)?;
    let resident = gpu
        .function(&name)
        .occupancy_max_active_blocks_per_multiprocessor(
            DECODE_THREADS,
            gpu.dyn_smem(&name) as usize,
            None,
        )
        .with_context(|| format!("{name}: resident CTAs"))?;
    Ok((resident as usize * gpu.num_sms as usize, slices))
}

/// Decode attention on `kernel` (resolved by `decode_kernel`); with `num_splits > 1` also the
/// merge of the splits: with `cluster`, each (item, kv head slice)'s splits run as one
/// thread-block cluster and merge in distributed shared memory (at most `DECODE_CLUSTER_MAX`
/// splits, sm_90); else the decode kernel merges them itself when `p.counters` is set, or a
/// second launch does.
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn paged_decode(
    gpu: &Gpu,
    p: &PagedDecodeParams,
    head_dim: usize,
    kernel: DecodeKernel,
    cluster: bool,
) -> anyhow::Result<()> {
    let group = (p.num_heads / p.num_kv_heads) as usize;
    // The in-kernel merge keeps a weight per split in shared memory (DECODE_MAX_SPLITS).
    anyhow::ensure!(
        p.num_splits >= 1 && (p.counters == 0 || p.num_splits as usize <= MAX_FILLED_SPLITS),
        "decode attention with {} splits (at most {MAX_FILLED_SPLITS} merged in the kernel)",
        p.num_splits
    );
    let cluster = cluster && p.num_splits > 1;
    anyhow::ensure!(
        !cluster || (decode_cluster_supported(gpu) && p.num_splits as usize <= DECODE_CLUSTER_MAX),
        "decode attention with {} splits in a cluster (at most {DECODE_CLUSTER_MAX}, on sm_90+)",
        p.num_splits
    );
    let (name, slices) = decode_kernel_of(gpu, kernel, head_dim, group)?;
    // With PDL its CTAs are resident by the time the kernel before (rope_kv) ends: both kernels
    // wait (`decode_cta`) before reading what that kernel writes.
    let grid = (
        p.num_splits as u32,
        (p.num_kv_heads as usize * slices) as u32,
        p.num_items as u32,
    );
    if cluster {
        return gpu.launch_pdl_cluster(&name, grid, (DECODE_THREADS, 1, 1), grid.0, p);
    }
    gpu.launch_pdl(&name, grid, (DECODE_THREADS, 1, 1), p)?;
    if p.num_splits > 1 && p.counters == 0 {
        gpu.launch(
            &gpu.kv_kernel(&format!("paged_decode_reduce_hd{head_dim}_g{group}")),
            (p.num_heads as u32, p.num_items as u32, 1),
            (head_dim as u32, 1, 1),
            p,
        )?;
    }
    Ok(())
}

/// `name`, an attention kernel compiled per model shape, or an error when `Gpu::load_attention`
/// was not called for that shape.
fn attention_kernel(gpu: &Gpu, name: String) -> anyhow::Result<String> {
    anyhow::ensure!(
        gpu.has_function(&name),
        "no attention kernel {name}: Gpu::load_attention was not called for its head_dim and group"
    );
    Ok(name)
}

/// How a backend splits decode attention's keys: the split rule, the kernel and whether splits
/// may merge in a thread-block cluster (`forward::decode_split_rule` builds the serving one;
/// `Limits::decode_splits` and `gpu-bench attention`'s "serving" row apply it).
#[derive(Debug, Clone, Copy)]
pub struct DecodeSplitRule {
    pub num_sms: u32,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// 0: `decode_splits`; else `decode_splits_filled` with this many CTAs per SM and the fewest
    /// keys a split `decode_min_split_keys` gives `kernel` (or `min_keys`, when set).
    pub ctas_per_sm: usize,
    pub kernel: DecodeKernel,
    /// `CudaBackendOptions::decode_min_split_keys` (0: `decode_min_split_keys`).
    pub min_keys: usize,
    /// Decode CTAs one wave of the decode kernel holds (resident CTAs an SM × SMs) when its
    /// splits may merge in a thread-block cluster (`CudaBackendOptions::decode_cluster` on a GPU
    /// that has them); 0: never.
    pub cluster_wave: usize,
    /// Decode CTAs an item takes per split: kv heads × CTAs a kv head.
    pub item_ctas: usize,
}

impl DecodeSplitRule {
    /// Decode splits for `nd` items whose longest context is `max_context` keys, and whether
    /// they merge in a thread-block cluster. A cluster merge caps the splits at
    /// `DECODE_CLUSTER_MAX` and is taken only where the capped grid fills at most half a wave of
    /// the kernel. Clusters are placed whole, within a GPC, and a fuller grid left CTAs for a
    /// second round: measured (BENCHMARKS.md, session 35), batch-1 decode steps at 48 % of a wave
    /// were 0.2-1.4 % faster with the cluster merge (Llama-2-7B and Llama-3-8B, 128 to 7.9k
    /// tokens, H100 and H200), while Llama-2-7B at batch 4 and 8 (4k tokens, 97 % of a wave)
    /// was 5-11 % slower, and Llama-3-8B at batch 4 and 16 (two waves) 4-5 % slower.
    pub fn splits(&self, nd: usize, max_context: usize) -> (usize, bool) {
        let splits = match self.ctas_per_sm {
            0 => decode_splits(self.num_sms, nd, self.num_kv_heads, max_context),
            c => decode_splits_filled(
                self.num_sms,
                c,
                nd,
                self.num_kv_heads,
                self.num_heads / self.num_kv_heads.max(1),
                max_context,
                match self.min_keys {
                    0 => decode_min_split_keys(self.kernel, max_context),
                    k => k.max(MIN_SPLIT_KEYS),
                },
            ),
        };
        let capped = splits.min(DECODE_CLUSTER_MAX);
        let ctas = nd * self.item_ctas * capped;
        match self.cluster_wave > 0 && capped > 1 && 2 * ctas <= self.cluster_wave {
            true => (capped, true),
            false => (splits, false),
        }
    }
}

/// Splits per (item, kv head) so that the grid covers the GPU about twice, with at least
/// `min_tokens` keys per split (shorter splits cost more in merging than they gain).
pub fn decode_splits(
    num_sms: u32,
    num_items: usize,
    num_kv_heads: usize,
    max_context: usize,
) -> usize {
    // Few keys per split: at batch 1 a decode is latency-bound, and a CTA walking 256 keys alone
    // took longer than the merge of more, shorter splits (measured on the H200).
    const MIN_TOKENS: usize = 32;
    const MAX_SPLITS: usize = 32;
    let ctas = (num_items * num_kv_heads).max(1);
    let want = (2 * num_sms as usize).div_ceil(ctas);
    want.min(max_context.div_ceil(MIN_TOKENS))
        .clamp(1, MAX_SPLITS)
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn prefill_attn(
    gpu: &Gpu,
    p: &PrefillAttnParams,
    head_dim: usize,
) -> anyhow::Result<()> {
    let name = match p.kv_maps {
        0 => prefill_attn_kernel(gpu, head_dim)?,
        _ => prefill_tma_kernel(gpu, head_dim),
    };
    prefill_attn_named(gpu, p, &name)
}

/// The TMA build of the wgmma prefill kernel (`Gpu::load_attention` builds it where
/// `Gpu::prefill_tma` and the cache is bf16; its pipelined loop with `Gpu::prefill_wg_stages`
/// 2); launched for params that carry tensor maps.
pub fn prefill_tma_kernel(gpu: &Gpu, head_dim: usize) -> String {
    format!(
        "prefill_attn_wg_hd{head_dim}_tma_st{}",
        gpu.prefill_wg_stages
    )
}

/// Bytes of one tensor map (CUtensorMap), and its alignment on the device.
pub const TENSOR_MAP_BYTES: usize = 128;

/// The TMA tensor map of one layer's K or V cache at `ptr` (bf16 `[num_blocks, num_kv_heads,
/// block_size, head_dim]`) as prefill_attn_wgmma.cu's TMA build reads it: a 2-D tensor of
/// `[num_blocks * num_kv_heads * block_size rows, head_dim]`, boxes of min(block_size, 64) rows
/// x 64 dims (128 bytes) in the 128-byte swizzle wgmma reads.
pub fn kv_tensor_map(
    ptr: u64,
    num_blocks: usize,
    num_kv_heads: usize,
    block_size: usize,
    head_dim: usize,
) -> anyhow::Result<[u8; TENSOR_MAP_BYTES]> {
    use cudarc::driver::sys;
    anyhow::ensure!(
        head_dim % 64 == 0 && block_size.is_power_of_two() && ptr % 16 == 0,
        "no TMA map for head_dim {head_dim}, block_size {block_size}"
    );
    let dims = [
        head_dim as u64,
        (num_blocks * num_kv_heads * block_size) as u64,
    ];
    let strides = [(head_dim * 2) as u64];
    // A box is one block's keys within a tile (the kernel's WG_BN = PREFILL_TILE keys) x 64 dims.
    let boxes = [64u32, block_size.min(PREFILL_TILE) as u32];
    let elem_strides = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array has the rank's entries (strides: rank - 1); the map is written whole.
    let map = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .context("cuTensorMapEncodeTiled")?;
        map.assume_init()
    };
    // SAFETY: CUtensorMap is 128 bytes of plain data.
    Ok(unsafe { std::mem::transmute::<sys::CUtensorMap, [u8; TENSOR_MAP_BYTES]>(map) })
}

/// The K and V tensor maps of `layers` caches (`caches[l]` = (K, V) pointers) in one device
/// buffer, layer l's pair at `l * 2 * TENSOR_MAP_BYTES` (`PrefillAttnParams::kv_maps`).
pub fn kv_tensor_maps(
    gpu: &Gpu,
    caches: &[(u64, u64)],
    num_blocks: usize,
    num_kv_heads: usize,
    block_size: usize,
    head_dim: usize,
) -> anyhow::Result<DevBuf> {
    let mut bytes = Vec::with_capacity(caches.len() * 2 * TENSOR_MAP_BYTES);
    for &(k, v) in caches {
        for ptr in [k, v] {
            bytes.extend(kv_tensor_map(
                ptr,
                num_blocks,
                num_kv_heads,
                block_size,
                head_dim,
            )?);
        }
    }
    let buf = gpu.alloc(bytes.len())?;
    gpu.upload(buf.ptr(), &bytes)?;
    Ok(buf)
}

/// The prefill-attention kernel `prefill_attn` launches at `head_dim`: the wgmma kernel where
/// it was built (Hopper, head dim 64 or 128) and `gpu.prefill_wgmma`, else the mma.sync kernel
/// (each the build for the cache's dtype). Both take the same tiles, splits and scratch.
pub fn prefill_attn_kernel(gpu: &Gpu, head_dim: usize) -> anyhow::Result<String> {
    let piped = format!("prefill_attn_wg_hd{head_dim}_st2");
    if gpu.prefill_wgmma && gpu.prefill_wg_stages == 2 && !gpu.kv_fp8() && gpu.has_function(&piped)
    {
        return Ok(piped);
    }
    let wg = gpu.kv_kernel(&format!("prefill_attn_wg_hd{head_dim}"));
    if gpu.prefill_wgmma && gpu.has_function(&wg) {
        return Ok(wg);
    }
    attention_kernel(gpu, gpu.kv_kernel(&format!("prefill_attn_hd{head_dim}")))
}

/// `prefill_attn` through the loaded kernel `name` (a `Gpu::load_prefill_variant` build).
///
/// # Safety
/// As `prefill_attn`.
pub unsafe fn prefill_attn_named(
    gpu: &Gpu,
    p: &PrefillAttnParams,
    name: &str,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        p.num_splits >= 1
            && (p.num_splits == 1 || (p.part_acc != 0 && p.part_ml != 0 && p.counters != 0)),
        "prefill attention with {} splits needs split scratch and counters",
        p.num_splits
    );
    gpu.launch(
        name,
        (p.num_tiles as u32, p.num_heads as u32, p.num_splits as u32),
        (128, 1, 1),
        p,
    )
}

/// Prefill-attention CTAs a wave counts per SM in `prefill_splits`: three fit at head_dim <= 128
/// (168 registers, `__launch_bounds__(128, 3)`). At 2 (the rule's value while two fit) it
/// under-split 256-512-query chunks at 8-16k context; at 3 it picks the fastest of the forced
/// split counts in 26 of 30 (chunk, context) cases of Llama-2-7B and Llama-3-8B and is within 5 %
/// elsewhere (`gpu-bench prefill-chunks`; BENCHMARKS.md, issue 18, session 16). Head dims above 128
/// fit two a SM; the rule then aims at a wave a third larger than the GPU holds.
pub const PREFILL_SPLIT_FILL: usize = 3;
/// Most split CTAs (tiles x heads x splits) per SM of a launch that splits: two waves (the split
/// scratch is sized from it).
pub const PREFILL_SPLIT_CTAS_PER_SM: usize = 2 * PREFILL_SPLIT_FILL;
/// Fewest key tiles (of 64 keys) a split walks: shorter splits cost more to merge than they gain
/// (H200: a 64-query chunk at 2k context took 104 µs in 4 splits of 8 tiles, 132 µs in 8 of 4).
pub const PREFILL_SPLIT_MIN_KEY_TILES: usize = 8;
/// Fewest key tiles a split walks when the unsplit launch already fills half a wave: its CTAs
/// then run the whole context at fewer CTAs an SM, and two waves of splits shorter than this
/// lose to it (H200, wgmma kernel: a 512-query chunk at 2k context took 71 µs unsplit, 81 µs in
/// 3 splits of ~11 tiles; at 8k the same chunk's 3 splits of ~43 tiles win, 238 against 270 µs).
pub const PREFILL_SPLIT_MIN_KEY_TILES_HALF_WAVE: usize = 16;
/// Most splits per (tile, head).
pub const PREFILL_MAX_SPLITS: usize = 32;

/// Splits per (64-query tile, head) for a flash prefill launch of `num_tiles` tiles whose longest
/// context is `max_context`. A short chunk at a long context is otherwise a quarter of the GPU
/// walking 16k keys: one 64-query tile x 32 heads is 32 CTAs. 1 when tiles x heads already fill
/// a wave (`PREFILL_SPLIT_FILL` CTAs per SM); else the count that minimises waves / splits (a
/// CTA's time is about its share of the keys), within two waves and at least
/// `PREFILL_SPLIT_MIN_KEY_TILES` key tiles a split (`PREFILL_SPLIT_MIN_KEY_TILES_HALF_WAVE` once
/// tiles x heads fill half a wave), the fewest among equals (less to merge).
pub fn prefill_splits(
    num_sms: u32,
    num_tiles: usize,
    num_heads: usize,
    max_context: usize,
) -> usize {
    let ctas = (num_tiles * num_heads).max(1);
    let wave = PREFILL_SPLIT_FILL * num_sms.max(1) as usize;
    if ctas >= wave {
        return 1;
    }
    let min_key_tiles = match 2 * ctas >= wave {
        true => PREFILL_SPLIT_MIN_KEY_TILES_HALF_WAVE,
        false => PREFILL_SPLIT_MIN_KEY_TILES,
    };
    let most = (PREFILL_SPLIT_CTAS_PER_SM * num_sms.max(1) as usize / ctas)
        .min(max_context.div_ceil(PREFILL_TILE) / min_key_tiles)
        .clamp(1, PREFILL_MAX_SPLITS);
    // waves / splits, compared as fractions: w1 / s1 < w2 / s2.
    let waves = |s: usize| (ctas * s).div_ceil(wave);
    (1..=most).fold(1, |best, s| match waves(s) * best < waves(best) * s {
        true => s,
        false => best,
    })
}

/// Bytes of split scratch (`part_acc`, `part_ml`) and arrival counters that any launch chosen
/// by `prefill_splits` on `num_sms` SMs needs at `head_dim`: (acc, ml, counters) in elements.
pub fn prefill_split_scratch(num_sms: u32, head_dim: usize) -> (usize, usize, usize) {
    // A split launch has fewer than a wave of (tile, head) groups and at most two waves of CTAs.
    let ctas = PREFILL_SPLIT_CTAS_PER_SM * num_sms as usize;
    let groups = PREFILL_SPLIT_FILL * num_sms as usize;
    (
        ctas * PREFILL_TILE * head_dim,
        ctas * PREFILL_TILE * 2,
        groups,
    )
}

/// `max_ctx`: the longest context among the entries (sizes the grid).
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn kv_gather(gpu: &Gpu, p: &KvGatherParams, max_ctx: usize) -> anyhow::Result<()> {
    // 16-byte pieces: 8 bf16, or 16 e4m3.
    let piece = if gpu.kv_fp8() { 16 } else { 8 };
    anyhow::ensure!(
        p.head_dim % piece == 0 && p.num_heads % p.num_kv_heads == 0,
        "kv_gather needs head_dim % {piece} == 0 and whole GQA groups; got head_dim {}, {} / {} heads",
        p.head_dim,
        p.num_heads,
        p.num_kv_heads
    );
    let tiles = max_ctx.div_ceil(GATHER_KEYS);
    match gemm_entry_grid(tiles, p.num_kv_heads, p.num_gemm) {
        Some(grid) => gpu.launch(&gpu.kv_kernel("kv_gather"), grid, (128, 1, 1), p),
        None => Ok(()),
    }
}

/// The grid of a GEMM prefill path kernel: (`tiles`, `heads`, one per GEMM-path entry), or None
/// when there is no such entry (nothing to launch).
fn gemm_entry_grid(tiles: usize, heads: i32, num_gemm: i32) -> Option<(u32, u32, u32)> {
    (num_gemm > 0).then_some((tiles as u32, heads as u32, num_gemm as u32))
}

/// `max_q_len`: the most queries among the entries (sizes the grid).
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn causal_softmax(
    gpu: &Gpu,
    p: &CausalSoftmaxParams,
    max_q_len: usize,
) -> anyhow::Result<()> {
    let tiles = max_q_len.div_ceil(SOFTMAX_ROWS);
    match gemm_entry_grid(tiles, p.num_heads, p.num_gemm) {
        Some(grid) => gpu.launch("causal_softmax", grid, (32 * SOFTMAX_ROWS as u32, 1, 1), p),
        None => Ok(()),
    }
}

/// y = x · wᵀ for decode rows over bf16 weights: the bulk-copy kernel (gemv_bulk.cu) where
/// `gemv_bulk_grid` takes the shape, else gemv.cu's `gemv_m{m}` at `p.split`.
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn gemv(gpu: &Gpu, p: &GemvParams) -> anyhow::Result<()> {
    check_gemv_rows(p.m, p.k)?;
    if try_gemv_bulk(gpu, p)? {
        return Ok(());
    }
    launch_gemv(gpu, "gemv", (p.m, p.k, p.split), p.n, p, false)
}

/// `gemv` over e4m3 weights with one scale (`p.w_scale`); k % 16 == 0, sm_89+.
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn gemv_fp8(gpu: &Gpu, p: &GemvParams) -> anyhow::Result<()> {
    anyhow::ensure!(
        p.k % 16 == 0 && p.w_scale != 0,
        "gemv_fp8 needs k % 16 == 0 and a scale; got k {}",
        p.k
    );
    launch_gemv(gpu, "gemv_fp8", (p.m, p.k, p.split), p.n, p, false)
}

/// Launches `{family}_m{m}` (gemv.cu) over `outputs` outputs, `split` warps
/// each, after checking `(m, k, split)`; `writes_kv`: the kernel writes the KV cache (its
/// `-DKV_FP8` build for an e4m3 cache, `Gpu::kv_kernel`).
///
/// # Safety
/// As the public launchers.
unsafe fn launch_gemv<P: Copy>(
    gpu: &Gpu,
    family: &str,
    (m, k, split): (i32, i32, i32),
    outputs: i32,
    p: &P,
    writes_kv: bool,
) -> anyhow::Result<()> {
    check_gemv_rows(m, k)?;
    anyhow::ensure!(
        split > 0 && (GEMV_WARPS as i32) % split == 0,
        "gemv split {split} must divide {GEMV_WARPS}"
    );
    let name = format!("{family}_m{m}");
    gpu.launch_pdl(
        &match writes_kv {
            true => gpu.kv_kernel(&name),
            false => name,
        },
        gemv_grid(outputs, split),
        (32 * GEMV_WARPS, 1, 1),
        p,
    )
}

fn check_gemv_rows(m: i32, k: i32) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=GEMV_MAX_M as i32).contains(&m) && k % 8 == 0,
        "gemv takes 1 to {GEMV_MAX_M} rows and k % 8 == 0; got m {m} k {k}"
    );
    Ok(())
}

/// gate|up projection with SiLU × up in the epilogue (decode, m <= 4).
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn gemv_silu(gpu: &Gpu, p: &GemvSiluParams) -> anyhow::Result<()> {
    launch_gemv(gpu, "gemv_silu", (p.m, p.k, p.split), p.inter, p, false)
}

/// QKV projection with RoPE and the paged K/V write in the epilogue (decode, m <= 4).
///
/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn gemv_qkv_rope(gpu: &Gpu, p: &GemvQkvRopeParams) -> anyhow::Result<()> {
    let pairs = (p.num_heads + 2 * p.num_kv_heads) * p.head_dim / 2;
    launch_gemv(gpu, "gemv_qkv_rope", (p.m, p.k, p.split), pairs, p, true)
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn sample(gpu: &Gpu, p: &SampleParams) -> anyhow::Result<()> {
    anyhow::ensure!(
        p.vocab > 0 && p.vocab <= p.stride,
        "sample: vocab {} must be in 1..=stride {}",
        p.vocab,
        p.stride
    );
    gpu.launch_small(
        pdl_small::SAMPLE,
        "sample",
        (p.num_rows as u32, 1, 1),
        (SAMPLE_THREADS, 1, 1),
        p,
    )
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn sample_counts_update(gpu: &Gpu, p: &SampleCountsUpdateParams) -> anyhow::Result<()> {
    let n = p.num_updates.max(0) as u32;
    let blocks = n.div_ceil(256).clamp(1, gpu.num_sms * 4);
    gpu.launch("sample_counts_update", (blocks, 1, 1), (256, 1, 1), p)
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn sample_counts_move(gpu: &Gpu, p: &SampleCountsMoveParams) -> anyhow::Result<()> {
    let blocks = (p.vocab.max(1) as u32).div_ceil(256).min(gpu.num_sms * 2);
    gpu.launch("sample_counts_move", (blocks, 1, 1), (256, 1, 1), p)
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn block_table_update(gpu: &Gpu, p: &BlockTableUpdateParams) -> anyhow::Result<()> {
    let n = p.num_updates.max(0) as u32;
    let blocks = n.div_ceil(256).clamp(1, gpu.num_sms * 4);
    gpu.launch("block_table_update", (blocks, 1, 1), (256, 1, 1), p)
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in the kernel's .cu file.
pub unsafe fn fill_uniform(gpu: &Gpu, p: &FillParams) -> anyhow::Result<()> {
    let blocks = (p.n.div_ceil(256)).min(gpu.num_sms as u64 * 16) as u32;
    gpu.launch("fill_uniform", (blocks.max(1), 1, 1), (256, 1, 1), p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_kernel_takes_tensor_cores_for_gqa_and_e4m3_where_the_head_dim_allows() {
        use DecodeKernel::*;
        // MHA with a bf16 cache: the lane kernel, unless asked; with e4m3, tensor cores.
        assert_eq!(decode_kernel(Auto, 128, 1, false), Lanes);
        assert_eq!(decode_kernel(Auto, 128, 1, true), Mma);
        assert_eq!(decode_kernel(Auto, 96, 1, true), Mma);
        // Llama-3-8B (group 4) and Qwen2.5-7B (7), either cache dtype: tensor cores.
        for fp8 in [false, true] {
            assert_eq!(decode_kernel(Auto, 128, 4, fp8), Mma);
            assert_eq!(decode_kernel(Auto, 128, 7, fp8), Mma);
            assert_eq!(decode_kernel(Mma, 128, 1, fp8), Mma);
            assert_eq!(decode_kernel(Lanes, 128, 4, fp8), Lanes);
            // Head dims above 128 have no tensor-core kernel, whatever is asked.
            assert_eq!(decode_kernel(Mma, 256, 4, fp8), Lanes);
        }
        // Splits of 128 keys on tensor cores from 1k keys of context, else of 32.
        assert_eq!(decode_min_split_keys(Mma, 4096), 128);
        assert_eq!(decode_min_split_keys(Mma, 1023), MIN_SPLIT_KEYS);
        assert_eq!(decode_min_split_keys(Lanes, 4096), MIN_SPLIT_KEYS);
        // e4m3 V slices (head_dim / 8 bytes) must be whole words: 96 yes, 80 no.
        assert!(decode_mma_supported(96, true) && !decode_mma_supported(80, true));
        assert!(decode_mma_supported(80, false) && decode_mma_supported(16, false));
        assert_eq!(decode_kernel(Auto, 80, 4, true), Lanes);
        // A slice's CTAs never outnumber the lane kernel's, whose count sizes the counters.
        for g in 1..=32 {
            for fp8 in [false, true] {
                assert!(decode_mma_group_ctas(g) <= decode_group_ctas_for(g, fp8));
            }
        }
    }

    #[test]
    fn decode_splits_fill_the_gpu_and_respect_the_minimum() {
        // One sequence, 32 kv heads on 132 SMs: 9 splits would fill; 128 keys allow 4.
        assert_eq!(decode_splits(132, 1, 32, 128), 4);
        assert_eq!(decode_splits(132, 1, 32, 1024), 9);
        assert_eq!(decode_splits(132, 1, 32, 16384), 9);
        // Enough CTAs without splitting.
        assert_eq!(decode_splits(132, 64, 32, 16384), 1);
        assert_eq!(decode_splits(132, 1, 1, 1 << 20), 32);
    }

    #[test]
    fn prefill_splits_fill_short_chunks_and_stay_within_the_scratch() {
        // Llama-2-7B heads on 132 SMs (a wave: 396 CTAs): one 64-query tile at 16k is 32 CTAs,
        // 12 splits fill one wave (24 would be two waves of half the keys each: a tie, and the
        // fewer splits win). At 2k the 32 key tiles allow 4 splits of 8.
        assert_eq!(prefill_splits(132, 1, 32, 16384), 12);
        assert_eq!(prefill_splits(132, 1, 32, 2048), 4);
        assert_eq!(prefill_splits(132, 1, 32, 1024), 2);
        // 128 CTAs: 3 splits make one wave (6 would make two).
        assert_eq!(prefill_splits(132, 4, 32, 16384), 3);
        // 150 CTAs: 5 splits are two waves of a fifth of the keys each.
        assert_eq!(prefill_splits(132, 5, 30, 16384), 5);
        // A 512-query chunk (256 CTAs): 3 splits in two waves of a third of the keys.
        assert_eq!(prefill_splits(132, 8, 32, 16384), 3);
        assert_eq!(prefill_splits(132, 8, 32, 8192), 3);
        // ... but not at 2k, where a third of the keys (11 tiles) is too short a split for a
        // launch that already fills half a wave; a 256-query chunk there still splits.
        assert_eq!(prefill_splits(132, 8, 32, 2048), 1);
        assert_eq!(prefill_splits(132, 4, 32, 2048), 3);
        // 396 CTAs and more already fill the GPU: a 832-query chunk, a 2048-token prompt.
        assert_eq!(prefill_splits(132, 13, 32, 16384), 1);
        assert_eq!(prefill_splits(132, 32, 32, 2048), 1);
        // Too few keys to split: a short prompt.
        assert_eq!(prefill_splits(132, 1, 32, 200), 1);
        assert_eq!(prefill_splits(132, 1, 1, 1 << 20), PREFILL_MAX_SPLITS);
        // Every split launch fits the scratch sized for the device.
        for sms in [1, 8, 78, 132] {
            let (acc, ml, counters) = prefill_split_scratch(sms, 128);
            for tiles in 1..40 {
                for heads in [1, 4, 8, 28, 32, 64] {
                    for ctx in [64, 256, 1000, 4096, 16384, 131072] {
                        let s = prefill_splits(sms, tiles, heads, ctx);
                        if s > 1 {
                            let ctas = tiles * heads * s;
                            assert!(
                                ctas * PREFILL_TILE * 128 <= acc && ctas * PREFILL_TILE * 2 <= ml
                            );
                            assert!(tiles * heads <= counters, "{sms} {tiles} {heads} {ctx}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn attention_covers_every_family_head_dim_and_group() {
        for hd in [64, 80, 96, 128, 256] {
            for group in 1..=16 {
                assert!(attention_supported(hd, group), "hd {hd} g {group}");
            }
        }
        assert!(!attention_supported(72, 1) && !attention_supported(512, 1));
        assert!(!attention_supported(128, 0));
        // Up to 8 heads a CTA, larger groups in equal slices (mirrors paged_decode.cu).
        let slices = |g: usize| (decode_group_ctas(g), g.div_ceil(decode_group_ctas(g)));
        assert_eq!(slices(7), (1, 7));
        assert_eq!(slices(8), (1, 8));
        assert_eq!(slices(9), (2, 5));
        assert_eq!(slices(16), (2, 8));
        assert_eq!(slices(24), (3, 8));
    }

    #[test]
    fn gemv_split_shares_only_long_rows() {
        for (k, split) in [
            (384, 1),
            (2048, 1),
            (4096, 1),
            (5632, 1),
            (11008, 4),
            (14336, 4),
        ] {
            assert_eq!(default_gemv_split(k), split, "k {k}");
        }
    }

    #[test]
    fn param_structs_match_the_c_layout() {
        // C pads a struct to its largest member's alignment; the Rust mirrors must agree.
        assert_eq!(std::mem::size_of::<SampleArgs>(), 64);
        assert_eq!(std::mem::size_of::<SampleEdit>(), 8);
        assert_eq!(std::mem::size_of::<SampleParams>(), 9 * 8 + 3 * 4 + 4);
        assert_eq!(std::mem::size_of::<SampleCountsUpdateParams>(), 2 * 8 + 8);
        assert_eq!(std::mem::size_of::<SampleCountsMoveParams>(), 8 + 3 * 4 + 4);
        assert_eq!(std::mem::size_of::<PagedDecodeParams>(), 11 * 8 + 8 * 4);
        assert_eq!(std::mem::size_of::<StampParams>(), 8 + 4 + 4);
        assert_eq!(std::mem::size_of::<FeedTokensParams>(), 2 * 8 + 2 * 4);
        assert_eq!(std::mem::size_of::<PrefillAttnParams>(), 14 * 8 + 7 * 4 + 4);
        assert_eq!(std::mem::size_of::<RopeKvParams>(), 10 * 8 + 7 * 4 + 4);
        assert_eq!(std::mem::size_of::<AddRmsNormParams>(), 5 * 8 + 3 * 4 + 4);
        assert_eq!(std::mem::size_of::<KvGatherParams>(), 8 * 8 + 6 * 4);
        assert_eq!(std::mem::size_of::<GemvParams>(), 4 * 8 + 4 * 4 + 8);
        assert_eq!(std::mem::size_of::<GemvBulkParams>(), 4 * 8 + 3 * 4 + 4);
        assert_eq!(std::mem::size_of::<AmaxScaleParams>(), 5 * 8);
        assert_eq!(std::mem::size_of::<QuantScaledParams>(), 4 * 8);
        assert_eq!(
            std::mem::size_of::<KvStageParams>(),
            4 * 8 + 3 * 4 + KV_STAGE_MAX_BLOCKS * 4 + 4
        );
        assert_eq!(
            std::mem::size_of::<CausalSoftmaxParams>(),
            6 * 8 + 3 * 4 + 4
        );
    }

    #[test]
    fn scores_rows_are_16_byte_aligned() {
        for (ctx, ld) in [(1, 8), (8, 8), (9, 16), (255, 256)] {
            assert_eq!(scores_ld(ctx), ld);
        }
    }
}
