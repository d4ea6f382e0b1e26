//! The CPU backend: the Llama forward on candle (f32) over a paged KV pool, then per-request
//! sampling. It lives on the executor's thread; with `num_threads` set it runs its GEMMs and
//! attention on a rayon pool of its own, so it does not compete with other rayon users.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;

use crate::executor::backend::{Backend, BackendInfo};
use crate::model::config::ModelConfig;
use crate::model::llama::{KvPool, LlamaModel};
use crate::model::loader::{load_weights, ModelWeights};
use crate::sampling::sampler::Sampler;
use crate::step::{BatchInput, SampledToken, StepOutput};

#[derive(Debug, Clone)]
pub struct CpuBackendOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory for the KV pool (f32 K and V, all layers); the block count is derived from it.
    pub kv_cache_bytes: usize,
    /// Threads for the forward; `None` uses rayon's global pool.
    pub num_threads: Option<usize>,
    /// Show a progress bar on stderr while weights load.
    pub progress: bool,
}

impl Default for CpuBackendOptions {
    fn default() -> Self {
        CpuBackendOptions {
            block_size: 16,
            kv_cache_bytes: 256 << 20,
            num_threads: None,
            progress: true,
        }
    }
}

pub struct CpuBackend {
    model: LlamaModel,
    kv: KvPool,
    threads: Option<rayon::ThreadPool>,
    sampler: Sampler,
}

impl CpuBackend {
    /// Loads the Hugging Face model folder `dir` and allocates the KV pool.
    pub fn load(dir: &Path, opts: CpuBackendOptions) -> anyhow::Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let weights = load_weights(dir, &config, opts.progress)?;
        Self::from_parts(config, weights, &opts)
    }

    pub fn from_parts(
        config: ModelConfig,
        weights: ModelWeights,
        opts: &CpuBackendOptions,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(opts.block_size > 0, "block_size must be positive");
        let bytes_per_block = KvPool::bytes_per_block(&config, opts.block_size);
        let num_blocks = opts.kv_cache_bytes / bytes_per_block;
        anyhow::ensure!(
            num_blocks > 0,
            "kv_cache_bytes {} holds no KV block; one block of {} tokens needs {bytes_per_block} bytes",
            opts.kv_cache_bytes,
            opts.block_size
        );
        if num_blocks * opts.block_size < config.max_position_embeddings {
            tracing::warn!(
                "the KV pool holds {} tokens, fewer than one sequence of max_position_embeddings {}",
                num_blocks * opts.block_size,
                config.max_position_embeddings
            );
        }
        let threads = match opts.num_threads {
            None => None,
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("brook-cpu-{i}"))
                    .build()
                    .context("building the CPU executor's thread pool")?,
            ),
        };
        let kv = KvPool::new(&config, num_blocks, opts.block_size);
        let model = LlamaModel::new(config, weights)?;
        Ok(CpuBackend {
            model,
            kv,
            threads,
            sampler: Sampler::new(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// Runs the batch and returns the logits of each sampled sequence, in seq order.
    pub fn forward_logits(&mut self, batch: &BatchInput) -> anyhow::Result<Vec<Vec<f32>>> {
        let (flat, vocab) = self.forward_flat(batch)?;
        Ok(flat.chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// Logits `[num_sampled * vocab]` row-major, and the vocabulary size.
    fn forward_flat(&mut self, batch: &BatchInput) -> anyhow::Result<(Vec<f32>, usize)> {
        batch
            .validate(self.kv.block_size(), self.kv.num_blocks())
            .map_err(|e| anyhow::anyhow!("invalid batch: {e}"))?;
        let (model, kv) = (&self.model, &mut self.kv);
        let logits = match &self.threads {
            Some(pool) => pool.install(|| model.forward(batch, kv))?,
            None => model.forward(batch, kv)?,
        };
        Ok((
            logits.flatten_all()?.to_vec1::<f32>()?,
            model.config().vocab_size,
        ))
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            device: "cpu".into(),
            num_kv_blocks: self.kv.num_blocks(),
            block_size: self.kv.block_size(),
            bytes_per_block: KvPool::bytes_per_block(self.model.config(), self.kv.block_size()),
        }
    }

    fn execute(&mut self, batch: &BatchInput) -> anyhow::Result<StepOutput> {
        let start = Instant::now();
        let (logits, vocab) = self.forward_flat(batch)?;
        let sampling = batch
            .seqs
            .iter()
            .filter_map(|s| s.sample.as_ref().map(|x| (s.request_id, x)));
        let sampled = sampling
            .zip(logits.chunks(vocab))
            .map(|((request_id, s), row)| {
                let out = self.sampler.sample(row, &s.params, s.seed, s.output_index);
                SampledToken {
                    request_id,
                    token: out.token,
                    logprob: out.logprob,
                }
            })
            .collect();
        Ok(StepOutput {
            sampled,
            elapsed: start.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests;
