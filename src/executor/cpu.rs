//! The CPU backend: the Llama-family forward on candle (f32) over a paged KV pool, then per-request
//! sampling. It lives on the executor's thread and runs each step on a rayon pool of its own
//! (`num_threads`, or rayon's default count), so it does not compete with other rayon users. The
//! whole step runs inside the pool (one hand-over per step): a parallel op called from outside a
//! pool hands its work over and sleeps until it is done, dozens of times a step.
//!
//! Speculative decoding: with a proposer (`load_speculative`: n-gram lookup, or a draft model
//! whose K/V shares the target's block ids, `draft.rs`) a step first proposes drafts for the
//! requests the scheduler gave draft positions, then runs the target over their k + 1
//! positions and verifies on the host (`executor::verify`).
//!
//! Tensor parallelism (`tensor_parallel_size` > 1, `tp.rs`): the backend's model is rank 0's
//! shard and ranks 1..N run beside it on threads of their own; everything else (input batch,
//! sampling, proposer) stays here, once.

pub mod draft;
pub mod tp;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use crate::executor::backend::{Backend, BackendInfo};
use crate::executor::input_batch::InputBatch;
use crate::executor::kv_tier::{CpuHostTier, KvTier};
use crate::executor::verify::{HostSampler, Logits, StepDrafts};
use crate::model::config::ModelConfig;
use crate::model::llama::{KvPool, LlamaModel};
use crate::model::loader::{load_weights, ModelWeights};
use crate::model::shard::{check_split, shard_config};
use crate::spec::ngram::NgramProposer;
use crate::spec::{Proposer, SpecConfig, SpecMethod};
use crate::step::{BatchInput, SchedulerOutput, StepOutput};

use self::draft::CpuDraft;
use self::tp::{RankPools, TpPeers, TpWorld};

#[derive(Debug, Clone)]
pub struct CpuBackendOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory for the KV pool (f32 K and V, all layers); the block count is derived from it.
    pub kv_cache_bytes: usize,
    /// Threads for the forward; `None`: rayon's default (`RAYON_NUM_THREADS`, else every core).
    pub num_threads: Option<usize>,
    /// Show a progress bar on stderr while weights load.
    pub progress: bool,
    /// Memory for the KV host tier (0: none): blocks evicted from the pool or swapped out go
    /// there (`executor::kv_tier`).
    pub host_kv_cache_bytes: usize,
    /// Copy bandwidth between the tiers, bytes per second; None: measured at start.
    pub copy_bytes_per_s: Option<f64>,
    /// Ranks the model is split over (Megatron-style, `model::shard`; 1: none). Each rank
    /// holds its KV heads of every block in a pool of `kv_cache_bytes` (the budget is a
    /// rank's, as a GPU's memory is) and gets `num_threads / N` of the threads.
    pub tensor_parallel_size: usize,
}

pub struct CpuBackend {
    /// The whole model's config (with tensor parallelism `model` holds rank 0's shard).
    config: ModelConfig,
    model: LlamaModel,
    kv: KvPool,
    /// Ranks 1..N under tensor parallelism.
    peers: Option<TpPeers>,
    threads: Arc<rayon::ThreadPool>,
    sampler: HostSampler,
    /// The requests in flight: their tokens, sampling state and block tables.
    input: InputBatch,
    /// The KV host tier, when configured.
    host: Option<CpuHostTier>,
    /// Ids sampled: the first `sample_vocab` logits of a row (`sample_below`).
    sample_vocab: usize,
    /// Speculative decoding's proposer, when the engine speculates.
    proposer: Option<Box<dyn Proposer>>,
    /// Bytes of one KV block: the target's, plus the draft model's when there is one.
    bytes_per_block: usize,
    drafts: StepDrafts,
}

/// A draft model loaded next to the target (`--speculative draft`).
pub struct DraftParts {
    pub config: ModelConfig,
    pub weights: ModelWeights,
}

impl CpuBackend {
    /// Loads the Hugging Face model folder `dir` and allocates the KV pool.
    pub fn load(dir: &Path, opts: CpuBackendOptions) -> anyhow::Result<Self> {
        Self::load_speculative(dir, opts, &SpecConfig::default())
    }

    /// As `load`, with the proposer `spec` asks for (a draft model is loaded from
    /// `spec.draft_model`; its compatibility with the target is the caller's to check,
    /// `spec::compat`).
    pub fn load_speculative(
        dir: &Path,
        opts: CpuBackendOptions,
        spec: &SpecConfig,
    ) -> anyhow::Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let weights = load_weights(dir, &config, opts.progress)?;
        let draft = match (spec.method, &spec.draft_model) {
            (SpecMethod::Draft, Some(d)) => {
                let config = ModelConfig::from_dir(d)?;
                let weights = load_weights(d, &config, opts.progress)?;
                Some(DraftParts { config, weights })
            }
            _ => None,
        };
        Self::from_parts_speculative(config, weights, &opts, spec, draft)
    }

    pub fn from_parts(
        config: ModelConfig,
        weights: ModelWeights,
        opts: &CpuBackendOptions,
    ) -> anyhow::Result<Self> {
        Self::from_parts_speculative(config, weights, opts, &SpecConfig::default(), None)
    }

    /// From weights in memory, with `spec`'s proposer (`draft`: the draft model, for
    /// `SpecMethod::Draft`).
    pub fn from_parts_speculative(
        config: ModelConfig,
        weights: ModelWeights,
        opts: &CpuBackendOptions,
        spec: &SpecConfig,
        draft: Option<DraftParts>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(opts.block_size > 0, "block_size must be positive");
        anyhow::ensure!(
            (spec.method == SpecMethod::Draft) == draft.is_some(),
            "a draft model goes with --speculative draft, and only with it"
        );
        let world = opts.tensor_parallel_size;
        check_split(&config, world)?;
        // A rank's shard: its KV heads are what one block costs it.
        let rank_config = shard_config(&config, world);
        let draft_bytes = draft
            .as_ref()
            .map_or(0, |d| KvPool::bytes_per_block(&d.config, opts.block_size));
        let bytes_per_block = KvPool::bytes_per_block(&rank_config, opts.block_size) + draft_bytes;
        super::host_memory::check(
            "the KV cache (--kv-cache-mib) with its host tier (--cpu-kv-cache-gib), each per tensor-parallel rank",
            opts.kv_cache_bytes
                .saturating_add(opts.host_kv_cache_bytes)
                .saturating_mul(world),
        )?;
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
        // Ranks share the cores: each gets its part of the threads.
        let threads_per_rank = match world {
            1 => opts.num_threads.unwrap_or(0),
            _ => {
                let all = opts.num_threads.unwrap_or_else(rayon::current_num_threads);
                (all / world).max(1)
            }
        };
        let threads = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads_per_rank)
                .thread_name(|i| format!("brook-cpu-{i}"))
                .build()
                .context("building the CPU executor's thread pool")?,
        );
        let mut kv = KvPool::new(&rank_config, num_blocks, opts.block_size);
        // The host tier holds the target's K/V only: a request swapped out is forgotten by the
        // draft model (it is among the step's preempted), which recomputes its own K/V.
        let num_host =
            opts.host_kv_cache_bytes / KvPool::bytes_per_block(&rank_config, opts.block_size);
        let host = (num_host > 0).then(|| {
            let pool = KvPool::new(&rank_config, num_host, opts.block_size);
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
        let (model, peers) = match world {
            1 => (LlamaModel::new(config.clone(), weights)?, None),
            _ => {
                let pools = RankPools {
                    num_blocks,
                    block_size: opts.block_size,
                    host: host.as_ref().map(|h| (h.num_blocks(), h.bytes_per_s())),
                };
                let w = TpWorld::start(&config, weights, world, pools, threads_per_rank)?;
                (w.rank0, Some(w.peers))
            }
        };
        let proposer: Option<Box<dyn Proposer>> = match (spec.method, draft) {
            (SpecMethod::Off, _) => None,
            (SpecMethod::Ngram, _) => {
                Some(Box::new(NgramProposer::new(spec.ngram_min, spec.ngram_max)))
            }
            (SpecMethod::Draft, Some(d)) => {
                let kv = KvPool::new(&d.config, num_blocks, opts.block_size);
                let model = LlamaModel::new(d.config, d.weights)?;
                Some(Box::new(CpuDraft::proposer(
                    model,
                    kv,
                    Some(threads.clone()),
                )))
            }
            (SpecMethod::Draft, None) => unreachable!("checked above"),
        };
        Ok(CpuBackend {
            config,
            model,
            kv,
            peers,
            threads,
            sampler: HostSampler::new(),
            input,
            host,
            sample_vocab,
            proposer,
            bytes_per_block,
            drafts: StepDrafts::default(),
        })
    }

    /// Samples only ids below `n` (at most the vocabulary): a synthetic model served with a
    /// tokenizer smaller than its shape's vocabulary emits only ids the tokenizer can decode.
    /// The other logits are masked out, log-probabilities included (as the CUDA sampler does).
    pub fn sample_below(mut self, n: usize) -> Self {
        self.sample_vocab = n.clamp(1, self.config.vocab_size);
        self
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device pool's block `b` (tests compare tiers with it); rank 0's under tensor
    /// parallelism.
    pub fn kv_block(&self, b: usize) -> Vec<f32> {
        self.kv.block_data(b)
    }

    /// The host tier's block `b`, if there is a host tier.
    pub fn host_kv_block(&self, b: usize) -> Option<Vec<f32>> {
        self.host.as_ref().map(|h| h.host().block_data(b))
    }

    /// Runs the batch and returns its logit rows (`BatchInput::num_logit_rows`), in seq order.
    pub fn forward_logits(&mut self, batch: &BatchInput) -> anyhow::Result<Vec<Vec<f32>>> {
        let (flat, vocab) = self.forward_flat(batch)?;
        Ok(flat.chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// Runs a batch built by hand (tests): forward and sampling, outside the persistent input
    /// batch of `execute` (drafts in it are verified as point-mass proposals; penalties see no
    /// earlier tokens).
    pub fn execute_batch(&mut self, batch: &BatchInput) -> anyhow::Result<StepOutput> {
        let start = Instant::now();
        let (logits, vocab) = self.forward_flat(batch)?;
        self.drafts.fill_from_batch(batch);
        let mut out = StepOutput::default();
        let drafts = &self.drafts;
        let logits = Logits {
            data: &logits,
            vocab,
            sample_vocab: self.sample_vocab,
        };
        self.sampler
            .sample_batch(batch, logits, drafts, |_| None, &mut out);
        out.elapsed = start.elapsed();
        Ok(out)
    }
}

/// The model's parts a forward uses (borrowed apart from the rest of the backend).
struct Forward<'a> {
    model: &'a LlamaModel,
    kv: &'a mut KvPool,
    peers: Option<&'a TpPeers>,
    threads: &'a rayon::ThreadPool,
}

impl Forward<'_> {
    /// Logits `[num_sampled * vocab]` row-major, and the vocabulary size.
    fn run(self, batch: &BatchInput) -> anyhow::Result<(Vec<f32>, usize)> {
        let Forward {
            model,
            kv,
            peers,
            threads,
        } = self;
        batch
            .validate(kv.block_size(), kv.num_blocks())
            .and_then(|()| batch.validate_window(kv.block_size(), model.config().sliding_window))
            .map_err(|e| anyhow::anyhow!("invalid batch: {e}"))?;
        model.check_batch(batch)?;
        // Within the pool already (a step), `install` runs the forward in place.
        let mut rank0 = move || threads.install(|| model.forward(batch, kv));
        let logits = match peers {
            None => rank0()?,
            Some(p) => p.forward(batch, rank0),
        };
        Ok((logits, model.config().vocab_size))
    }
}

impl CpuBackend {
    fn forward_flat(&mut self, batch: &BatchInput) -> anyhow::Result<(Vec<f32>, usize)> {
        Forward {
            model: &self.model,
            kv: &mut self.kv,
            peers: self.peers.as_ref(),
            threads: &self.threads,
        }
        .run(batch)
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            device: match &self.peers {
                None => "cpu".into(),
                Some(p) => format!("cpu (tensor parallel: {} ranks)", p.world_size()),
            },
            num_kv_blocks: self.kv.num_blocks(),
            block_size: self.kv.block_size(),
            bytes_per_block: self.bytes_per_block,
            num_host_blocks: self.num_host_blocks(),
            copy_bytes_per_s: self.copy_bytes_per_s(),
        }
    }

    fn execute(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput> {
        let pool = Arc::clone(&self.threads);
        pool.install(|| self.execute_in_pool(step))
    }

    /// Rebuilds the pool with the executor thread as its worker 0 (same thread count), so
    /// `execute`'s `install` runs in place: no hand-over to a pool thread and back each step
    /// (two wake-ups), and one thread fewer competing for the cores. A thread can belong to
    /// one such pool only, and rayon leaks it (its registry lives as long as the thread): a
    /// backend rebuilt on the same thread after a panic keeps its own pool (`install` then
    /// hands over, as before).
    fn on_executor_thread(&mut self) {
        let n = self.threads.current_num_threads();
        match rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .use_current_thread()
            .thread_name(|i| format!("brook-cpu-{i}"))
            .build()
        {
            Ok(pool) => self.threads = Arc::new(pool),
            Err(e) => tracing::debug!("the executor thread stays outside the CPU pool: {e}"),
        }
    }
}

impl CpuBackend {
    /// One step, on a thread of the backend's pool (`execute`).
    fn execute_in_pool(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput> {
        let start = Instant::now();
        let (copies, for_forward) = (&step.kv_copies, step.kv_copies_for_forward);
        match &mut self.host {
            // Every step: the last step's overlapped copies land first.
            Some(h) => h.apply_step(&mut self.kv, copies, for_forward)?,
            // Copy-on-write needs no host tier (and the forward waits for it).
            None => CpuHostTier::apply_on_device(&mut self.kv, copies)?,
        }
        if let Some(p) = &mut self.peers {
            p.step_copies(copies, for_forward);
        }
        let CpuBackend {
            model,
            kv,
            peers,
            threads,
            sampler,
            input,
            sample_vocab,
            proposer,
            drafts,
            ..
        } = self;
        input.apply(step)?;
        let mut out = StepOutput::default();
        drafts.clear();
        if let Some(p) = proposer {
            for &id in step.finished_req_ids.iter().chain(&step.preempted) {
                p.forget(id);
            }
            let reqs = input.propose_requests();
            if !reqs.is_empty() {
                let t = Instant::now();
                let stats = p.propose(&reqs, &mut drafts.proposals)?;
                drafts.ids.extend(reqs.iter().map(|r| r.id));
                out.spec.elapsed = t.elapsed();
                (out.spec.passes, out.spec.tokens) = (stats.passes, stats.tokens);
            }
        }
        input.build(&drafts.proposals)?;
        let (batch, held) = (input.batch(), &*input);
        let forward = Forward {
            model,
            kv,
            peers: peers.as_ref(),
            threads,
        };
        let (logits, vocab) = forward.run(batch)?;
        let counts = |row| held.counts(row);
        let logits = Logits {
            data: &logits,
            vocab,
            sample_vocab: *sample_vocab,
        };
        sampler.sample_batch(batch, logits, drafts, counts, &mut out);
        out.elapsed = start.elapsed();
        tracing::trace!(
            tokens = batch.num_tokens(),
            drafts = batch.num_drafts(),
            propose_ms = out.spec.elapsed.as_secs_f64() * 1e3,
            step_ms = out.elapsed.as_secs_f64() * 1e3,
            "cpu step"
        );
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
            Some(h) => h.apply(&mut self.kv, copies)?,
            None => CpuHostTier::apply_on_device(&mut self.kv, copies)?,
        }
        if let Some(p) = &mut self.peers {
            p.apply_copies(copies);
        }
        Ok(())
    }

    fn copy_bytes_per_s(&self) -> f64 {
        self.host.as_ref().map_or(0.0, CpuHostTier::bytes_per_s)
    }
}

#[cfg(test)]
mod tests;
