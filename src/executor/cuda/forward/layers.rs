//! The forward of one step as a chain of launches on the stream (see `forward`'s module docs):
//! the same code runs eagerly and under CUDA-graph capture.

use anyhow::Context;

use super::io::{out_logprobs, out_top_ids, out_top_logprobs, OUT_TOKENS};
use super::Forward;
use crate::executor::cuda::device::DevBuf;
use crate::executor::cuda::gemm::{linear, linear_add, Weight};
use crate::executor::cuda::kernels::{self, *};
use crate::executor::cuda::options::skip;
use crate::executor::cuda::prefill_gemm::{self, GemmAttention};
use crate::executor::cuda::step_meta::Step;

impl Forward {
    /// Enqueues the whole forward and sampling of `step` on the stream (also under capture).
    ///
    /// # Safety
    /// `step` came from `step_meta::pack` into `self.host` (its counts fit the buffers) and its
    /// metadata is uploaded (or will be, before a captured graph of it is launched).
    pub(super) unsafe fn enqueue(&self, step: &Step) -> anyhow::Result<()> {
        let stamp = |slot: i32| -> anyhow::Result<()> {
            if !self.opts.step_timing {
                return Ok(());
            }
            let p = StampParams {
                stamps: self.act.out.ptr(),
                slot,
            };
            // SAFETY: the output buffer starts with the two stamps.
            unsafe { kernels::stamp(&self.gpu, &p) }
        };
        stamp(0)?;
        self.enqueue_forward(step)?;
        stamp(1)
    }

    /// `enqueue` without the timing stamps.
    ///
    /// # Safety
    /// As `enqueue`.
    unsafe fn enqueue_forward(&self, step: &Step) -> anyhow::Result<()> {
        let c = &self.cfg;
        let g = &self.gpu;
        let fp8 = self.fp8.as_ref();
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
        let window = c.sliding_window.unwrap_or(0).min(i32::MAX as usize) as i32;
        let rope_scale = c.rope.attention_factor() as f32;
        // Few enough rows for the gemv kernels: their fused epilogues replace two launches (the
        // QKV one has no bias, head norm or RoPE scale).
        let fused = self.opts.fuse_decode
            && !self.weights.fp8()
            && t <= g.gemv_max_m
            && d % 8 == 0
            && inter % 8 == 0
            && !c.qkv_bias
            && !c.qk_norm
            && rope_scale == 1.0;
        let on = |kind: u32| self.opts.skip & kind == 0;
        // The o and down projections add into the residual (cuBLAS rows, bf16 weights): the
        // norms then read the residual alone. Else they write `delta`, which the next norm adds.
        // Not under tensor parallelism: a rank's product is a partial sum, reduced first.
        let add =
            self.opts.residual_gemm && !self.weights.fp8() && t > g.gemv_max_m && self.tp.is_none();
        let delta = if add { 0 } else { a.delta.ptr() };
        // y += x · wᵀ into the residual, or y = x · wᵀ into `delta` (summed over the ranks
        // under tensor parallelism: each holds the product of its slice of k).
        let project = |x: u64, w: Weight, k: usize| -> anyhow::Result<()> {
            match add {
                true => linear_add(g, x, w, a.residual.ptr(), (t, d, k)),
                false => {
                    linear(g, fp8, x, w, a.delta.ptr(), t, d, k, false)?;
                    match &self.tp {
                        Some(tp) => tp.all_reduce_bf16(g, a.delta.ptr(), t * d),
                        None => Ok(()),
                    }
                }
            }
        };
        kernels::embedding(
            g,
            &EmbeddingParams {
                table: self.weights.embed.ptr(),
                tokens: m(lay.tokens),
                out: a.residual.ptr(),
                num_tokens: t as i32,
                d: d as i32,
                vocab_start: self.tp.as_ref().map_or(0, |tp| tp.vocab_start) as u32,
                vocab_rows: self.head_rows() as u32,
            },
        )?;
        if let Some(tp) = &self.tp {
            // Each rank wrote the rows of the tokens in its slice, zeros elsewhere.
            tp.all_reduce_f32(g, a.residual.ptr(), t * d)?;
        }
        for (l, w) in self.weights.layers.iter().enumerate() {
            let norm = AddRmsNormParams {
                residual: a.residual.ptr(),
                delta: if l == 0 { 0 } else { delta },
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
                        w: w.qkv.w.ptr(),
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
                linear(
                    g,
                    fp8,
                    a.xn.ptr(),
                    w.qkv.weight(),
                    a.qkv.ptr(),
                    t,
                    qkv_dim,
                    d,
                    true,
                )?;
            }
            if !fused && on(skip::ROPE) {
                kernels::rope_kv(
                    g,
                    &RopeKvParams {
                        qkv: a.qkv.ptr(),
                        positions: m(lay.positions),
                        slots: m(lay.slots),
                        inv_freq: self.inv_freq.ptr(),
                        qkv_bias: w.qkv_bias.as_ref().map_or(0, DevBuf::ptr),
                        q_norm: w.qk_norm.as_ref().map_or(0, |(q, _)| q.ptr()),
                        k_norm: w.qk_norm.as_ref().map_or(0, |(_, k)| k.ptr()),
                        q_out: a.q.ptr(),
                        k_cache: self.k_cache(l),
                        v_cache: self.v_cache(l),
                        num_tokens: t as i32,
                        num_heads: h as i32,
                        num_kv_heads: kvh as i32,
                        head_dim: hd as i32,
                        block_size: self.opts.block_size as i32,
                        eps,
                        rope_scale,
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
                    block_tables: self.block_tables.ptr(),
                    context_lens: m(lay.ctx),
                    out: a.attn.ptr(),
                    part_acc: a.part_acc.ptr(),
                    part_ml: a.part_ml.ptr(),
                    counters: if self.opts.decode_merge_inline {
                        a.decode_counters.ptr()
                    } else {
                        0
                    },
                    num_items: step.nd as i32,
                    num_heads: h as i32,
                    num_kv_heads: kvh as i32,
                    block_size: self.opts.block_size as i32,
                    max_blocks: self.max_blocks as i32,
                    num_splits: step.splits as i32,
                    window,
                    scale,
                };
                kernels::paged_decode(g, &p, hd, self.opts.decode_kernel, step.decode_cluster)?;
            }
            if step.nt > 0 && on(skip::ATTENTION) {
                let p = PrefillAttnParams {
                    q: a.q.ptr(),
                    k_cache: self.k_cache(l),
                    v_cache: self.v_cache(l),
                    tile_seq: m(lay.tile_seq),
                    tile_q0: m(lay.tile_q0),
                    q_start: m(lay.q_start),
                    q_len: m(lay.q_len),
                    context_lens: m(lay.ctx),
                    block_tables: self.block_tables.ptr(),
                    out: a.attn.ptr(),
                    part_acc: a.prefill_acc.ptr(),
                    part_ml: a.prefill_ml.ptr(),
                    counters: a.prefill_counters.ptr(),
                    num_tiles: step.nt as i32,
                    num_heads: h as i32,
                    num_kv_heads: kvh as i32,
                    block_size: self.opts.block_size as i32,
                    max_blocks: self.max_blocks as i32,
                    window,
                    num_splits: step.prefill_splits as i32,
                    scale,
                    kv_maps: match (&self.kv_maps, g.prefill_wgmma) {
                        (Some(maps), true) => {
                            maps.ptr() + (l * 2 * kernels::TENSOR_MAP_BYTES) as u64
                        }
                        _ => 0,
                    },
                };
                kernels::prefill_attn(g, &p, hd)?;
            }
            if !self.host.gemm.is_empty() && on(skip::ATTENTION) {
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
                        block_tables: self.block_tables.ptr(),
                        gemm_seq: m(lay.gemm_seq),
                        gemm_key0: m(lay.gemm_key0),
                        gemm_s0: m(lay.gemm_s0),
                        k_buf: scratch.k.ptr(),
                        v_buf: scratch.v.ptr(),
                        scores: scratch.scores.ptr(),
                        seqs: &self.host.gemm,
                        num_heads: h,
                        num_kv_heads: kvh,
                        head_dim: hd,
                        block_size: self.opts.block_size,
                        max_blocks: self.max_blocks,
                        scale,
                    },
                )?;
            }
            if on(skip::LINEAR) {
                project(a.attn.ptr(), w.o.weight(), c.q_dim())?;
            }
            if on(skip::NORMS) {
                kernels::add_rmsnorm(
                    g,
                    &AddRmsNormParams {
                        delta,
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
                        w: w.gate_up.w.ptr(),
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
                    fp8,
                    a.xn.ptr(),
                    w.gate_up.weight(),
                    a.gate_up.ptr(),
                    t,
                    2 * inter,
                    d,
                    !self.opts.gate_up_bf16,
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
                    self.opts.gate_up_bf16,
                )?;
            }
            if on(skip::LINEAR) {
                project(a.act.ptr(), w.down.weight(), inter)?;
            }
        }
        if step.ns == 0 {
            return Ok(());
        }
        if on(skip::HEAD) {
            let final_norm = AddRmsNormParams {
                residual: a.residual.ptr(),
                delta,
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
                None,
                a.head_in.ptr(),
                Weight::bf16(self.weights.lm_head_ptr()),
                a.logits.ptr(),
                step.ns,
                self.head_rows(),
                d,
                true,
            )?;
            if let Some(tp) = &self.tp {
                tp.gather_logits(g, a.logits.ptr(), step.ns)?;
            }
        }
        if !on(skip::SAMPLE) {
            return Ok(());
        }
        kernels::sample(
            g,
            &SampleParams {
                logits: a.logits.ptr(),
                args: m(lay.args),
                tokens: a.out.ptr() + OUT_TOKENS as u64,
                logprobs: a.out.ptr() + out_logprobs(step.ns) as u64,
                edits: m(lay.edits),
                counts: a.counts.ptr(),
                work: a.work.ptr(),
                top_ids: a.out.ptr() + out_top_ids(step.ns) as u64,
                top_logprobs: a.out.ptr() + out_top_logprobs(step.ns) as u64,
                num_rows: step.ns as i32,
                vocab: self.opts.sampled_vocab(c.vocab_size) as i32,
                stride: c.vocab_size as i32,
            },
        )
    }
}
