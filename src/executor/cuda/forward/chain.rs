//! The decode layers on the gemv chain (`CudaBackendOptions::gemv_chain`,
//! kernels/gemv_chain.cu): a layer's linear work at up to four rows in two cooperative launches
//! instead of seven, RoPE and attention between them as before:
//!
//! - `qkv`: [add + RMSNorm → QKV] (the QKV output fp32, as `rope_kv` reads it);
//! - `mlp`: [o → add + RMSNorm → gate|up → SiLU · up → down].
//!
//! The fp32 residual alternates between `Activations::residual` (A) and `res2` (B) so that no
//! launch writes what its other CTAs still read: layer input A (+ the last down projection's
//! delta) is normalised and written to B; B + the o projection's delta to A. After the last
//! layer the residual is in A, plus `delta`, as the final norm expects.

use crate::executor::cuda::device::{DevBuf, Gpu};
use crate::executor::cuda::kernels::{self, ChainOp, ChainX, GemvChainParams};
use crate::model::config::ModelConfig;

use super::super::weights::GpuWeights;
use super::{Activations, Forward};

/// Ops a layer has in `GemvChain::ops`: the QKV launch's one, then the MLP launch's three.
const OPS_PER_LAYER: usize = 4;

pub(super) struct GemvChain {
    /// The ring's stage size of this model's build (`kernels::chain_stage_bytes`).
    stage_bytes: usize,
    /// Its grid barrier rule (`CudaBackendOptions::gemv_chain_barrier`).
    barrier_rule: Option<usize>,
    /// Launched with PDL (`kernels::chain_pdl_works`).
    pdl: bool,
    /// Most rows a step may have for the chain (x in shared memory, the accumulator).
    max_m: usize,
    /// Device [layers * OPS_PER_LAYER] `ChainOp`: every pointer is fixed, so they are written
    /// once.
    ops: DevBuf,
    /// The grid barrier's words (`kernels::chain_barrier_words`), zero when allocated.
    barrier: DevBuf,
    /// Residual B: fp32 [max_m, hidden].
    _res2: DevBuf,
}

impl GemvChain {
    /// The chain for this model, or None where it does not apply: bf16 weights on one GPU whose
    /// bulk ring is on (sm_90+), rows the build takes (`kernels::chain_stage_bytes`).
    pub(super) fn new(
        gpu: &mut Gpu,
        cfg: &ModelConfig,
        weights: &GpuWeights,
        act: &Activations,
        barrier_rule: Option<usize>,
    ) -> anyhow::Result<Option<GemvChain>> {
        if weights.fp8() {
            return Ok(None);
        }
        let (d, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let qkv_dim = cfg.q_dim() + 2 * cfg.kv_dim();
        let shapes = [(qkv_dim, d), (d, cfg.q_dim()), (2 * inter, d), (d, inter)];
        let Some(stage_bytes) = kernels::chain_stage_bytes(gpu, 1, &shapes) else {
            return Ok(None);
        };
        let max_m = (1..=kernels::GEMV_MAX_M)
            .take_while(|&m| kernels::chain_stage_bytes(gpu, m, &shapes).is_some())
            .last()
            .unwrap_or(1);
        gpu.load_gemv_chain_variant(stage_bytes, barrier_rule)?;
        let pdl = kernels::chain_pdl_works(gpu, stage_bytes, barrier_rule);
        let res2 = gpu.alloc(max_m * d * 4)?;
        let (a, b) = (act.residual.ptr(), res2.ptr());
        let eps = cfg.rms_norm_eps as f32;
        let mut ops = Vec::with_capacity(weights.layers.len() * OPS_PER_LAYER);
        for (l, w) in weights.layers.iter().enumerate() {
            ops.push(ChainOp {
                src: a,
                delta: if l == 0 { 0 } else { act.delta.ptr() },
                gamma: w.input_norm.ptr(),
                res_out: b,
                y: 0,
                y32: act.qkv.ptr(),
                x_mode: ChainX::Norm,
                eps,
                ..ChainOp::plain(w.qkv.w.ptr(), 0, 0, qkv_dim, d)
            });
            ops.push(ChainOp::plain(
                w.o.w.ptr(),
                act.attn.ptr(),
                act.delta.ptr(),
                d,
                cfg.q_dim(),
            ));
            ops.push(ChainOp {
                src: b,
                delta: act.delta.ptr(),
                gamma: w.post_norm.ptr(),
                res_out: a,
                x_mode: ChainX::Norm,
                eps,
                ..ChainOp::plain(w.gate_up.w.ptr(), 0, act.gate_up.ptr(), 2 * inter, d)
            });
            ops.push(ChainOp {
                x_mode: ChainX::Silu,
                ..ChainOp::plain(w.down.w.ptr(), act.gate_up.ptr(), act.delta.ptr(), d, inter)
            });
        }
        let buf = gpu.alloc(std::mem::size_of_val(ops.as_slice()))?;
        gpu.upload(buf.ptr(), &ops)?;
        let words = kernels::chain_barrier_words(gpu);
        let barrier = gpu.alloc(words * 4)?;
        gpu.memset(barrier.ptr(), 0, words * 4)?;
        Ok(Some(GemvChain {
            stage_bytes,
            barrier_rule,
            pdl,
            max_m,
            ops: buf,
            barrier,
            _res2: res2,
        }))
    }

    /// Launches `count` ops of layer `layer` from its op `first`, at `m` rows.
    ///
    /// # Safety
    /// The activations the ops read hold the step's rows (m <= `max_m`).
    unsafe fn launch(
        &self,
        gpu: &Gpu,
        layer: usize,
        first: usize,
        count: usize,
        m: usize,
    ) -> anyhow::Result<()> {
        let op = layer * OPS_PER_LAYER + first;
        let p = GemvChainParams {
            ops: self.ops.at::<ChainOp>(op),
            count: count as i32,
            m: m as i32,
            barrier: self.barrier.ptr(),
        };
        kernels::gemv_chain_variant(gpu, &p, self.stage_bytes, self.barrier_rule, self.pdl)
    }
}

impl Forward {
    /// The chain, where it takes a step of `t` tokens: on (`gemv_chain`), built for this model,
    /// few enough rows, one GPU, no part of the forward skipped (benchmarks).
    pub(super) fn chain_for(&self, t: usize) -> Option<&GemvChain> {
        let c = self.chain.as_ref()?;
        (t <= c.max_m && self.tp.is_none() && self.opts.skip == 0).then_some(c)
    }

    /// The most rows a step may have for the chain; None without it.
    pub(crate) fn chain_rows(&self) -> Option<usize> {
        self.chain.as_ref().map(|c| c.max_m)
    }

    /// Layer `l`'s add + RMSNorm and QKV projection, into `qkv` (fp32).
    ///
    /// # Safety
    /// As `enqueue`, with `chain` from `chain_for(t)`.
    pub(super) unsafe fn chain_qkv(
        &self,
        chain: &GemvChain,
        l: usize,
        t: usize,
    ) -> anyhow::Result<()> {
        chain.launch(&self.gpu, l, 0, 1, t)
    }

    /// Layer `l`'s o projection, add + RMSNorm, gate|up, SiLU · up and down projection, into
    /// `delta`.
    ///
    /// # Safety
    /// As `chain_qkv`.
    pub(super) unsafe fn chain_mlp(
        &self,
        chain: &GemvChain,
        l: usize,
        t: usize,
    ) -> anyhow::Result<()> {
        chain.launch(&self.gpu, l, 1, OPS_PER_LAYER - 1, t)
    }
}
