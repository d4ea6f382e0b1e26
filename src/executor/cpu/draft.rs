//! The draft model's forward on the CPU (`spec::draft::DraftModel`): the proposer's passes,
//! its KV rules and sampling are `spec::draft`'s. Its pool has the target pool's block count and
//! block size (`CpuBackend` sizes the pool for the pair).

use std::sync::Arc;

use crate::model::llama::{KvPool, LlamaModel};
use crate::sampling::sampler::argmax;
use crate::spec::draft::{DraftModel, DraftOut, DraftProposer};
use crate::step::BatchInput;

pub struct CpuDraft {
    model: LlamaModel,
    kv: KvPool,
    threads: Option<Arc<rayon::ThreadPool>>,
}

impl CpuDraft {
    /// The draft-model proposer over `model`; `kv` has the target pool's block count and block
    /// size.
    pub fn proposer(
        model: LlamaModel,
        kv: KvPool,
        threads: Option<Arc<rayon::ThreadPool>>,
    ) -> DraftProposer<CpuDraft> {
        DraftProposer::new(CpuDraft { model, kv, threads })
    }
}

impl DraftModel for CpuDraft {
    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    fn max_tokens(&self) -> usize {
        usize::MAX
    }

    fn forward(&mut self, batch: &BatchInput, out: DraftOut<'_>) -> anyhow::Result<()> {
        batch
            .validate(self.kv.block_size(), self.kv.num_blocks())
            .map_err(|e| anyhow::anyhow!("invalid draft batch: {e}"))?;
        // Inside a pool already (a step of the target's, whose pool may have been rebuilt on
        // the executor thread: `CpuBackend::on_executor_thread`), the forward runs there: an
        // `install` into this handle's pool would hand each pass over to another pool.
        let logits = match &self.threads {
            Some(pool) if rayon::current_thread_index().is_none() => {
                pool.install(|| self.model.forward(batch, &mut self.kv))?
            }
            _ => self.model.forward(batch, &mut self.kv)?,
        };
        let flat = logits;
        out.argmax
            .extend(flat.chunks(self.vocab()).map(|row| argmax(row).0));
        if let Some(l) = out.logits {
            l.extend_from_slice(&flat);
        }
        Ok(())
    }
}
