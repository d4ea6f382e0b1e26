//! Prefill attention for short contexts through cuBLAS, the way unfused attention has always run
//! (HF eager, FasterTransformer): for each sequence, S = Q·Kᵀ as one strided-batched GEMM over
//! the heads, a causal softmax kernel, then O = P·V as another GEMM written straight into the
//! attention output rows. At short contexts this beats the flash kernel, whose 64-query tiles
//! leave most of the GPU idle; past a length found by `gpu-bench prefill-attn` the flash kernel
//! wins (no S in memory, no masked half computed). The backend routes each prefill sequence by
//! its context length (`CudaBackendOptions::prefill_gemm_max_len`).
//!
//! Per layer: `kv_gather` copies each sequence's K and V (cached prefix + chunk) from the paged
//! cache into contiguous per-query-head scratch, then per sequence the S GEMM, one
//! `causal_softmax` launch for all sequences (bf16 P written over S in place), and per sequence
//! the P·V GEMM.

use super::device::{DevBuf, Gpu};
use super::gemm::{gemm_strided_batched, Operand};
use super::kernels::{self, scores_ld, CausalSoftmaxParams, KvGatherParams};

/// One sequence on the GEMM path, and where its data live in the scratch buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmSeq {
    /// Row of the step's per-sequence tables (q_len, context_lens, block_tables).
    pub seq: usize,
    /// Token row of its first query (in q and in the attention output).
    pub q_start: usize,
    pub q_len: usize,
    /// Keys: the cached prefix and this chunk.
    pub ctx: usize,
    /// First key row in the gathered K and V: the sequence's K starts at key0 · heads · head_dim.
    pub key0: usize,
    /// First float of its scores, [heads, q_len, scores_ld(ctx)].
    pub s0: usize,
}

/// The scores scratch stays under this many bytes; sequences that do not fit in a step go to the
/// flash kernel (with 32 heads, one fresh prompt of up to 1448 tokens fits).
pub const SCORES_MAX_BYTES: usize = 256 << 20;

/// (key rows, score floats) of scratch for a limit of `max_len` context tokens: enough keys for a
/// step of fresh prompts filling the token budget, and scores for the worst case of those keys
/// (every query row at the longest context), capped by `SCORES_MAX_BYTES`. (0, 0) when off.
/// `max_len` is at most the longest context a sequence can have.
pub fn scratch_capacity(
    max_len: usize,
    max_tokens: usize,
    max_seqs: usize,
    num_heads: usize,
) -> (usize, usize) {
    if max_len == 0 {
        return (0, 0);
    }
    let keys = max_tokens.max(max_len).min(max_seqs * max_len);
    let scores = (num_heads * scores_ld(max_len) * keys).min(SCORES_MAX_BYTES / 4);
    (keys, scores)
}

/// Hands out scratch to one step's GEMM-path sequences, in order, within fixed capacities.
#[derive(Debug, Clone)]
pub struct GemmPlanner {
    max_len: usize,
    num_heads: usize,
    key_cap: usize,
    score_cap: usize,
    keys: usize,
    scores: usize,
}

impl GemmPlanner {
    pub fn new(max_len: usize, num_heads: usize, key_cap: usize, score_cap: usize) -> Self {
        GemmPlanner {
            max_len,
            num_heads,
            key_cap,
            score_cap,
            keys: 0,
            scores: 0,
        }
    }

    /// Scratch for a sequence of `q_len` queries over `ctx` keys, or None when it belongs to the
    /// flash kernel: a context over the limit, or the step's scratch is full.
    pub fn place(
        &mut self,
        seq: usize,
        q_start: usize,
        q_len: usize,
        ctx: usize,
    ) -> Option<GemmSeq> {
        let scores = self.num_heads * q_len * scores_ld(ctx);
        let fits = ctx <= self.max_len
            && q_len <= ctx
            && self.keys + ctx <= self.key_cap
            && self.scores + scores <= self.score_cap;
        if !fits {
            return None;
        }
        let s = GemmSeq {
            seq,
            q_start,
            q_len,
            ctx,
            key0: self.keys,
            s0: self.scores,
        };
        self.keys += ctx;
        self.scores += scores;
        Some(s)
    }
}

/// Device buffers of the GEMM path.
pub struct GemmScratch {
    pub k: DevBuf,
    pub v: DevBuf,
    pub scores: DevBuf,
}

impl GemmScratch {
    pub fn alloc(
        gpu: &Gpu,
        keys: usize,
        score_floats: usize,
        num_heads: usize,
        head_dim: usize,
    ) -> anyhow::Result<Self> {
        let kv_bytes = keys * num_heads * head_dim * 2;
        Ok(GemmScratch {
            k: gpu.alloc(kv_bytes)?,
            v: gpu.alloc(kv_bytes)?,
            scores: gpu.alloc(score_floats * 4)?,
        })
    }

    pub fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes() + self.scores.bytes()
    }
}

/// What the GEMM path reads and writes for one layer. Device tables are those of the step
/// (`q_lens`, `context_lens`, `block_tables` per sequence; `gemm_*` per entry of `seqs`, holding
/// its `seq`, `key0` and `s0` as i32).
#[derive(Debug, Clone, Copy)]
pub struct GemmAttention<'a> {
    /// [num_tokens, num_heads, head_dim] bf16, RoPE applied.
    pub q: u64,
    /// [num_tokens, num_heads, head_dim] bf16; only the rows of `seqs` are written.
    pub out: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub q_lens: u64,
    pub context_lens: u64,
    pub block_tables: u64,
    pub gemm_seq: u64,
    pub gemm_key0: u64,
    pub gemm_s0: u64,
    /// Scratch: K and V [Σ ctx, num_heads, head_dim] bf16 each, scores [Σ heads·q_len·ld] fp32.
    pub k_buf: u64,
    pub v_buf: u64,
    pub scores: u64,
    pub seqs: &'a [GemmSeq],
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub max_blocks: usize,
    pub scale: f32,
}

/// Enqueues the GEMM path for every sequence of `p.seqs`.
///
/// # Safety
/// Every pointer in `p` addresses a live buffer of the shape documented on its field, the device
/// tables hold `p.seqs` (and their sequences' rows), and the scratch holds their offsets.
pub unsafe fn gemm_attention(gpu: &Gpu, p: &GemmAttention) -> anyhow::Result<()> {
    if p.seqs.is_empty() {
        return Ok(());
    }
    let (h, hd) = (p.num_heads, p.head_dim);
    let max_ctx = p.seqs.iter().map(|s| s.ctx).max().unwrap_or(0);
    let max_q = p.seqs.iter().map(|s| s.q_len).max().unwrap_or(0);
    kernels::kv_gather(
        gpu,
        &KvGatherParams {
            k_cache: p.k_cache,
            v_cache: p.v_cache,
            gemm_seq: p.gemm_seq,
            gemm_key0: p.gemm_key0,
            context_lens: p.context_lens,
            block_tables: p.block_tables,
            k_out: p.k_buf,
            v_out: p.v_buf,
            num_gemm: p.seqs.len() as i32,
            num_heads: h as i32,
            num_kv_heads: p.num_kv_heads as i32,
            head_dim: hd as i32,
            block_size: p.block_size as i32,
            max_blocks: p.max_blocks as i32,
        },
        max_ctx,
    )?;
    let bf16_at = |base: u64, elems: usize| base + (elems * 2) as u64;
    for s in p.seqs {
        let ld = scores_ld(s.ctx);
        // Column-major view, per head: Sᵀ [ctx, q_len] = K [ctx, hd] · Qᵀ [hd, q_len], where K is
        // the gathered [ctx, hd] rows (col-major [hd, ctx], ld hd, transposed) and Qᵀ is the
        // head's slice of the token rows (col-major [hd, q_len], ld heads·hd). Sᵀ col-major with
        // ld = ld is S row-major [q_len, ld].
        gemm_strided_batched(
            gpu,
            true,
            false,
            s.ctx,
            s.q_len,
            hd,
            Operand::bf16(bf16_at(p.k_buf, s.key0 * h * hd), hd, s.ctx * hd),
            Operand::bf16(bf16_at(p.q, s.q_start * h * hd), h * hd, hd),
            Operand::f32(p.scores + (s.s0 * 4) as u64, ld, s.q_len * ld),
            h,
        )?;
    }
    kernels::causal_softmax(
        gpu,
        &CausalSoftmaxParams {
            scores: p.scores,
            probs: p.scores,
            gemm_seq: p.gemm_seq,
            gemm_s0: p.gemm_s0,
            q_len: p.q_lens,
            context_lens: p.context_lens,
            num_gemm: p.seqs.len() as i32,
            num_heads: h as i32,
            scale: p.scale,
        },
        max_q,
    )?;
    for s in p.seqs {
        let ld = scores_ld(s.ctx);
        // Oᵀ [hd, q_len] = Vᵀ [hd, ctx] · Pᵀ [ctx, q_len]: V's rows are col-major [hd, ctx] (ld
        // hd), P row-major [q_len, 2·ld bf16] is col-major Pᵀ; Oᵀ col-major with ld heads·hd and
        // heads hd apart is exactly the head's slice of the output token rows.
        gemm_strided_batched(
            gpu,
            false,
            false,
            hd,
            s.q_len,
            s.ctx,
            Operand::bf16(bf16_at(p.v_buf, s.key0 * h * hd), hd, s.ctx * hd),
            Operand::bf16(p.scores + (s.s0 * 4) as u64, 2 * ld, 2 * s.q_len * ld),
            Operand::bf16(bf16_at(p.out, s.q_start * h * hd), h * hd, hd),
            h,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planner_packs_in_order_and_sends_overflow_to_flash() {
        // Limit 100 keys, 8 heads; scores of (60 q, 60 keys) and (40, 40) take 8·(60·64 + 40·40).
        let cap = 8 * (60 * 64 + 40 * 40);
        let mut p = GemmPlanner::new(100, 8, 150, cap + 10_000);
        let a = p.place(0, 0, 60, 60).unwrap();
        assert_eq!((a.key0, a.s0), (0, 0));
        assert_eq!(p.place(1, 60, 5, 101), None, "context over the limit");
        let b = p.place(2, 65, 40, 40).unwrap();
        assert_eq!((b.key0, b.s0), (60, 8 * 60 * 64));
        assert_eq!(p.place(3, 105, 2, 51), None, "keys full (100 + 51 > 150)");
        let mut q = GemmPlanner::new(100, 8, 1000, cap);
        q.place(0, 0, 60, 60).unwrap();
        q.place(1, 60, 40, 40).unwrap();
        assert_eq!(q.place(2, 100, 1, 1), None, "scores full");
    }

    #[test]
    fn scratch_is_bounded() {
        assert_eq!(scratch_capacity(0, 2048, 64, 32), (0, 0));
        // Default-ish: 256 keys limit, 2048-token steps, 32 heads: worst case fits the cap.
        assert_eq!(scratch_capacity(256, 2048, 64, 32), (2048, 32 * 256 * 2048));
        // Few sequences allowed: keys bounded by max_seqs · limit.
        assert_eq!(scratch_capacity(256, 8192, 4, 32).0, 1024);
        // Big steps: the scores are capped; a prompt whose scores alone pass the cap goes to the
        // flash kernel, a shorter one still fits.
        let (k, s) = scratch_capacity(4096, 16384, 256, 32);
        assert_eq!((k, s), (16384, SCORES_MAX_BYTES / 4));
        let mut p = GemmPlanner::new(4096, 32, k, s);
        assert_eq!(p.place(0, 0, 1500, 1500), None);
        assert!(p.place(0, 0, 1448, 1448).is_some());
    }
}
