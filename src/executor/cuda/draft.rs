//! The draft model's forward on the GPU (`spec::draft::DraftModel`; the proposer's passes, its
//! KV rules and sampling are `spec::draft`'s): a second `Forward` on the target's device, with
//! its own weights, activations, stream and KV pool. The pool has the target's block count and
//! is addressed by the target's block ids (the target's pool was sized for both,
//! `KvSizing::Free`), so draft KV counts in memory pressure and leaves with the request's
//! blocks. Each pass is a hand-built batch whose rows are its sequences: their whole tables go
//! up with it (a few hundred entries in the step's one metadata copy). Pure-decode passes (every
//! pass after the catch-up) replay the draft's own CUDA graphs. Greedy requests take the
//! device's argmax; a sampled request's logit row comes back for `spec::draft` to draw from.
//!
//! The two streams need no events: the draft's results are read on the host (which waits for
//! its stream) before the target's forward is launched, and the two models share no memory.

use std::path::Path;

use super::device::Gpu;
use super::forward::Forward;
use super::options::CudaBackendOptions;
use super::weights::GpuWeights;
use crate::model::config::ModelConfig;
use crate::spec::draft::{DraftModel, DraftOut};
use crate::step::BatchInput;

pub struct CudaDraft {
    fwd: Forward,
    /// (row · max_blocks + column, block id) of every table entry of a pass; reused.
    updates: Vec<(u32, u32)>,
}

impl CudaDraft {
    pub(super) fn new(fwd: Forward) -> Self {
        CudaDraft {
            fwd,
            updates: Vec::new(),
        }
    }
}

impl DraftModel for CudaDraft {
    fn vocab(&self) -> usize {
        self.fwd.cfg.vocab_size
    }

    fn block_size(&self) -> usize {
        self.fwd.opts.block_size
    }

    fn max_tokens(&self) -> usize {
        self.fwd.opts.max_num_batched_tokens
    }

    fn forward(&mut self, batch: &BatchInput, out: DraftOut<'_>) -> anyhow::Result<()> {
        let f = &mut self.fwd;
        f.gpu.ctx.bind_to_thread()?;
        batch
            .validate(f.opts.block_size, f.num_blocks)
            .map_err(|e| anyhow::anyhow!("invalid draft batch: {e}"))?;
        let width = f.max_blocks;
        self.updates.clear();
        for q in &batch.seqs {
            let table = batch.block_table(q);
            anyhow::ensure!(
                q.row < f.max_seqs && table.len() <= width,
                "draft pass: row {} of {} blocks; the draft has {} rows of {width}",
                q.row,
                table.len(),
                f.max_seqs
            );
            let at = (q.row * width) as u32;
            self.updates
                .extend(table.iter().enumerate().map(|(c, &id)| (at + c as u32, id)));
        }
        f.launch(batch, &self.updates, true, false)?;
        let (rows, _) = f.sampled(batch)?;
        out.argmax.extend(rows.iter().map(|r| r.token));
        if let Some(l) = out.logits {
            f.logit_rows(&[(0, rows.len())], l)?;
        }
        Ok(())
    }
}

/// A draft model loaded onto the target's device (`load_speculative`).
pub(super) struct DraftParts {
    pub gpu: Gpu,
    pub cfg: ModelConfig,
    pub weights: GpuWeights,
}

impl DraftParts {
    /// The draft in `dir`, whose config `cfg` the CUDA executor supports (checked by the
    /// caller), loaded onto the target's device.
    pub fn load(dir: &Path, cfg: ModelConfig, opts: &CudaBackendOptions) -> anyhow::Result<Self> {
        let gpu = Gpu::open(opts.device_ordinal)?;
        let weights = GpuWeights::load(&gpu, &cfg, dir, opts.progress)?;
        Ok(DraftParts { gpu, cfg, weights })
    }

    /// The draft's options: the target's sizes (steps, sequences, table width), none of the
    /// target's extras (host tier, lookahead, pinned staging, timing, drafts of its own).
    pub fn options(
        &self,
        target: &CudaBackendOptions,
        target_cfg: &ModelConfig,
    ) -> CudaBackendOptions {
        CudaBackendOptions {
            max_model_len: match target.max_model_len {
                0 => target_cfg.max_position_embeddings,
                n => n,
            },
            max_kv_cache_bytes: None,
            pinned_io: false,
            lookahead: false,
            lookahead_gate_us: None,
            step_timing: false,
            progress: false,
            host_kv_cache_bytes: 0,
            max_drafts: 0,
            skip: 0,
            ..target.clone()
        }
    }
}
