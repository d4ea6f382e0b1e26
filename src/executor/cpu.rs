//! The CPU backend: the Llama-family forward on candle (f32) over a paged KV pool, then per-request
//! sampling. It lives on the executor's thread; with `num_threads` set it runs its GEMMs and
//! attention on a rayon pool of its own, so it does not compete with other rayon users.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;

use crate::executor::backend::{Backend, BackendInfo};
use crate::executor::input_batch::InputBatch;
use crate::executor::kv_tier::{CpuHostTier, KvTier};
use crate::model::config::ModelConfig;
use crate::model::llama::{KvPool, LlamaModel};
use crate::model::loader::{load_weights, ModelWeights};
use crate::sampling::sampler::{Sampler, TokenCounts};
use crate::step::{BatchInput, SampledToken, SchedulerOutput, StepOutput, TopLogprobs};

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
    /// Memory for the KV host tier (0: none): blocks evicted from the pool or swapped out go
    /// there (`executor::kv_tier`).
    pub host_kv_cache_bytes: usize,
    /// Copy bandwidth between the tiers, bytes per second; None: measured at start.
    pub copy_bytes_per_s: Option<f64>,
}

pub struct CpuBackend {
    model: LlamaModel,
    kv: KvPool,
    threads: Option<rayon::ThreadPool>,
    sampler: Sampler,
    /// The requests in flight: their tokens, sampling state and block tables.
    input: InputBatch,
    /// The KV host tier, when configured.
    host: Option<CpuHostTier>,
    /// Ids sampled: the first `sample_vocab` logits of a row (`sample_below`).
    sample_vocab: usize,
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
        let mut kv = KvPool::new(&config, num_blocks, opts.block_size);
        let num_host = opts.host_kv_cache_bytes / bytes_per_block;
        let host = (num_host > 0).then(|| {
            let pool = KvPool::new(&config, num_host, opts.block_size);
            CpuHostTier::new(pool, &mut kv, opts.copy_bytes_per_s)
        });
        // A sequence is at most the model's context, and holds at most the whole pool.
        let max_blocks = config
            .max_position_embeddings
            .div_ceil(opts.block_size)
            .min(num_blocks);
        let input = InputBatch::new(opts.block_size, num_blocks, max_blocks)
            .with_sliding_window(config.sliding_window);
        let sample_vocab = config.vocab_size;
        let model = LlamaModel::new(config, weights)?;
        Ok(CpuBackend {
            model,
            kv,
            threads,
            sampler: Sampler::new(),
            input,
            host,
            sample_vocab,
        })
    }

    /// Samples only ids below `n` (at most the vocabulary): a synthetic model served with a
    /// tokenizer smaller than its shape's vocabulary emits only ids the tokenizer can decode.
    /// The other logits are masked out, log-probabilities included (as the CUDA sampler does).
    pub fn sample_below(mut self, n: usize) -> Self {
        self.sample_vocab = n.clamp(1, self.model.config().vocab_size);
        self
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// The device pool's block `b` (tests compare tiers with it).
    pub fn kv_block(&self, b: usize) -> Vec<f32> {
        self.kv.block_data(b)
    }

    /// The host tier's block `b`, if there is a host tier.
    pub fn host_kv_block(&self, b: usize) -> Option<Vec<f32>> {
        self.host.as_ref().map(|h| h.host().block_data(b))
    }

    /// Runs the batch and returns the logits of each sampled sequence, in seq order.
    pub fn forward_logits(&mut self, batch: &BatchInput) -> anyhow::Result<Vec<Vec<f32>>> {
        let (flat, vocab) = forward_flat(&self.model, &mut self.kv, self.threads.as_ref(), batch)?;
        Ok(flat.chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// Runs a batch built by hand (tests): forward and sampling, outside the persistent input
    /// batch of `execute` (so penalties see no earlier tokens).
    pub fn execute_batch(&mut self, batch: &BatchInput) -> anyhow::Result<StepOutput> {
        let start = Instant::now();
        let CpuBackend {
            model,
            kv,
            threads,
            sampler,
            sample_vocab,
            ..
        } = self;
        let sampling = Sampling {
            sampler,
            vocab: *sample_vocab,
        };
        run(
            model,
            kv,
            threads.as_ref(),
            sampling,
            batch,
            |_| None,
            start,
        )
    }
}

/// Logits `[num_sampled * vocab]` row-major, and the vocabulary size.
fn forward_flat(
    model: &LlamaModel,
    kv: &mut KvPool,
    threads: Option<&rayon::ThreadPool>,
    batch: &BatchInput,
) -> anyhow::Result<(Vec<f32>, usize)> {
    batch
        .validate(kv.block_size(), kv.num_blocks())
        .and_then(|()| batch.validate_window(kv.block_size(), model.config().sliding_window))
        .map_err(|e| anyhow::anyhow!("invalid batch: {e}"))?;
    let logits = match threads {
        Some(pool) => pool.install(|| model.forward(batch, kv))?,
        None => model.forward(batch, kv)?,
    };
    Ok((
        logits.flatten_all()?.to_vec1::<f32>()?,
        model.config().vocab_size,
    ))
}

/// The sampler and the ids it may draw (the first `vocab` of a row).
struct Sampling<'a> {
    sampler: &'a mut Sampler,
    vocab: usize,
}

/// Forward, then one token per sampling sequence; `counts(row)` gives the token counts of a
/// request with penalties.
fn run<'a>(
    model: &LlamaModel,
    kv: &mut KvPool,
    threads: Option<&rayon::ThreadPool>,
    sampling: Sampling<'_>,
    batch: &BatchInput,
    counts: impl Fn(usize) -> Option<&'a TokenCounts>,
    start: Instant,
) -> anyhow::Result<StepOutput> {
    let (logits, vocab) = forward_flat(model, kv, threads, batch)?;
    let Sampling { sampler, vocab: n } = sampling;
    let sampled = batch
        .seqs
        .iter()
        .filter_map(|s| s.sample.as_ref().map(|x| (s.request_id, s.row, x)));
    let mut out = StepOutput::default();
    for ((request_id, row, s), logits) in sampled.zip(logits.chunks(vocab)) {
        let (p, logits) = (&s.params, &logits[..n]);
        let got = sampler.sample(logits, p, s.seed, s.output_index, counts(row));
        out.sampled.push(SampledToken {
            request_id,
            token: got.token,
            logprob: got.logprob,
        });
        if let Some(k) = p.logprobs {
            let top = sampler.top_logprobs(logits, k);
            out.top_logprobs.push(TopLogprobs { request_id, top });
        }
    }
    out.elapsed = start.elapsed();
    Ok(out)
}

impl Backend for CpuBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            device: "cpu".into(),
            num_kv_blocks: self.kv.num_blocks(),
            block_size: self.kv.block_size(),
            bytes_per_block: KvPool::bytes_per_block(self.model.config(), self.kv.block_size()),
            num_host_blocks: self.num_host_blocks(),
            copy_bytes_per_s: self.copy_bytes_per_s(),
        }
    }

    fn execute(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput> {
        let start = Instant::now();
        let CpuBackend {
            model,
            kv,
            threads,
            sampler,
            input,
            host,
            sample_vocab,
        } = self;
        if !step.kv_copies.is_empty() {
            match host {
                Some(h) => h.apply(kv, &step.kv_copies)?,
                // Copy-on-write needs no host tier.
                None => CpuHostTier::apply_on_device(kv, &step.kv_copies)?,
            }
        }
        input.update(step)?;
        let (batch, held) = (input.batch(), &*input);
        let sampling = Sampling {
            sampler,
            vocab: *sample_vocab,
        };
        let out = run(
            model,
            kv,
            threads.as_ref(),
            sampling,
            batch,
            |row| held.counts(row),
            start,
        )?;
        input.record(&out)?;
        Ok(out)
    }
}

impl KvTier for CpuBackend {
    fn num_host_blocks(&self) -> usize {
        self.host.as_ref().map_or(0, CpuHostTier::num_blocks)
    }

    fn apply_copies(&mut self, copies: &[crate::step::BlockCopy]) -> anyhow::Result<()> {
        match &mut self.host {
            Some(h) => h.apply(&mut self.kv, copies),
            None => CpuHostTier::apply_on_device(&mut self.kv, copies),
        }
    }

    fn copy_bytes_per_s(&self) -> f64 {
        self.host.as_ref().map_or(0.0, CpuHostTier::bytes_per_s)
    }
}

#[cfg(test)]
mod tests;
