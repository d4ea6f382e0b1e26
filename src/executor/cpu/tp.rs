//! Tensor parallelism on the CPU executor (`--tensor-parallel-size N`): ranks 1..N of the world
//! run on threads of their own, each with its shard of the model (`model::shard`), its own KV
//! pool (its KV heads of every block: the scheduler's block ids index every rank's pool) and
//! its own rayon pool; rank 0 is the backend's model, on the executor thread. Each step the
//! backend hands the peers the batch (and any block copies), runs rank 0's forward and waits for
//! theirs: the ranks meet in the model's collectives (`parallel::ThreadComm`), and rank 0's
//! logits are the step's.
//!
//! With a KV host tier each rank holds its share of the host blocks too (its KV heads), and
//! applies every block copy the step carries to its own pools, at the points rank 0 does
//! (`executor::kv_tier`).
//!
//! A rank that fails mid-step aborts the world, which releases the ranks waiting for it; the
//! step then panics, so the executor actor rebuilds the backend (a world with a rank gone is in
//! no known state). Batches are checked before they reach any rank, so a bad batch fails the
//! step alone, the same on every rank.

use std::sync::Arc;

use anyhow::Context;

use crate::executor::kv_tier::CpuHostTier;
use crate::executor::rank_threads::RankThreads;
use crate::model::config::ModelConfig;
use crate::model::llama::{KvPool, LlamaModel, TpRank};
use crate::model::loader::ModelWeights;
use crate::model::shard::{shard_config, shard_weights, vocab_rows};
use crate::parallel::{Communicator, ThreadComm};
use crate::step::{BatchInput, BlockCopy};

/// What a peer rank does for a step.
enum Job {
    Forward(Arc<BatchInput>),
    /// A step's block copies: `CpuHostTier::apply_step` (the first `for_forward` now, the rest
    /// at the next step), or within the pool without a host tier.
    StepCopies {
        copies: Arc<[BlockCopy]>,
        for_forward: usize,
    },
    /// Block copies applied now (`KvTier::apply_copies`).
    Copies(Arc<[BlockCopy]>),
    /// Tests: the peer panics instead of running the step's forward.
    #[cfg(test)]
    Panic,
}

/// Ranks 1..N of a world whose rank 0 is the caller's model.
pub struct TpPeers {
    threads: RankThreads<Job>,
    /// The peers hold copies of the last step to apply at the next (`Job::StepCopies`).
    pending: bool,
    /// Tests: the next forward's peers panic (`Job::Panic`).
    #[cfg(test)]
    pub(crate) fail_next: std::sync::atomic::AtomicBool,
}

/// A world's rank 0 (the backend's own model) and its peers.
pub struct TpWorld {
    pub rank0: LlamaModel,
    pub peers: TpPeers,
}

/// Rank `rank`'s model: its shard of `weights` with its end of the world.
fn rank_model(
    config: &ModelConfig,
    weights: &ModelWeights,
    comm: ThreadComm,
    world: usize,
) -> anyhow::Result<LlamaModel> {
    let rank = comm.rank();
    let shard = shard_weights(config, weights, rank, world)?;
    let tp = TpRank {
        comm: Box::new(comm),
        vocab_start: rank * vocab_rows(config.vocab_size, world),
    };
    LlamaModel::new_rank(shard_config(config, world), shard, tp)
}

impl TpWorld {
    /// Splits `weights` (the whole model, `config`'s shapes; the split checked by the caller)
    /// over `world` ranks and starts ranks 1..N, each with a KV pool of `num_blocks` blocks of
    /// its shard's KV heads, a host tier like rank 0's (`host`: its blocks and measured copy
    /// bandwidth) and a rayon pool of `threads_per_rank` threads.
    pub fn start(
        config: &ModelConfig,
        weights: ModelWeights,
        world: usize,
        pools: RankPools,
        threads_per_rank: usize,
    ) -> anyhow::Result<Self> {
        let mut comms = ThreadComm::world(world).into_iter();
        let first = comms.next().expect("a world has a rank 0");
        let abort = first.abort_handle();
        let rank0 = rank_model(config, &weights, first, world)?;
        let shard = shard_config(config, world);
        let mut threads = RankThreads::new(abort);
        for comm in comms {
            let rank = comm.rank();
            let model = rank_model(config, &weights, comm, world)?;
            let RankPools {
                num_blocks,
                block_size,
                host,
            } = pools;
            let mut kv = KvPool::new(&shard, num_blocks, block_size);
            let host = host.map(|(blocks, bytes_per_s)| {
                let pool = KvPool::new(&shard, blocks, block_size);
                CpuHostTier::new(pool, &mut kv, Some(bytes_per_s))
            });
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads_per_rank)
                .thread_name(move |i| format!("brook-tp{rank}-{i}"))
                .build()
                .context("building a tensor-parallel rank's thread pool")?;
            let state = Rank {
                model,
                kv,
                host,
                pool,
            };
            threads.spawn(rank, move || Ok(state), Rank::run)?;
        }
        Ok(TpWorld {
            rank0,
            peers: TpPeers {
                threads,
                pending: false,
                #[cfg(test)]
                fail_next: Default::default(),
            },
        })
    }
}

/// Each rank's KV pools: blocks of the device pool, tokens a block, and the host tier's blocks
/// with its copy bandwidth (bytes per second), if there is one.
#[derive(Debug, Clone, Copy)]
pub struct RankPools {
    pub num_blocks: usize,
    pub block_size: usize,
    pub host: Option<(usize, f64)>,
}

/// A peer rank's state on its thread.
struct Rank {
    model: LlamaModel,
    kv: KvPool,
    host: Option<CpuHostTier>,
    pool: rayon::ThreadPool,
}

impl Rank {
    fn run(&mut self, job: &Job) -> anyhow::Result<()> {
        let kv = &mut self.kv;
        match job {
            Job::Forward(batch) => self
                .pool
                .install(|| self.model.forward(batch, kv))
                .map(drop),
            Job::StepCopies {
                copies,
                for_forward,
            } => match &mut self.host {
                Some(h) => h.apply_step(kv, copies, *for_forward),
                None => CpuHostTier::apply_on_device(kv, copies),
            },
            Job::Copies(copies) => match &mut self.host {
                Some(h) => h.apply(kv, copies),
                None => CpuHostTier::apply_on_device(kv, copies),
            },
            #[cfg(test)]
            Job::Panic => panic!("injected"),
        }
    }
}

impl TpPeers {
    /// Ranks in the world, rank 0 included.
    pub fn world_size(&self) -> usize {
        self.threads.world_size()
    }

    /// Runs the step's forward on every peer and `rank0` (rank 0's forward) here; returns rank
    /// 0's logits. `batch` must be checked already (`LlamaModel::check_batch`): a rank that
    /// fails now leaves the world broken, and this panics for the backend to be rebuilt.
    pub fn forward(
        &self,
        batch: &BatchInput,
        rank0: impl FnOnce() -> anyhow::Result<Vec<f32>>,
    ) -> Vec<f32> {
        let shared = Arc::new(batch.clone());
        #[cfg(test)]
        let inject = self
            .fail_next
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        let job = || {
            #[cfg(test)]
            if inject {
                return Job::Panic;
            }
            Job::Forward(shared.clone())
        };
        self.threads.run("step", job, rank0)
    }

    /// A step's block copies on every peer, as rank 0 applied them (which checked them): the
    /// first `for_forward` now, the rest at the next step, as `CpuHostTier::apply_step` does.
    pub fn step_copies(&mut self, copies: &[BlockCopy], for_forward: usize) {
        if copies.is_empty() && !self.pending {
            return;
        }
        let shared: Arc<[BlockCopy]> = copies.into();
        let job = || Job::StepCopies {
            copies: shared.clone(),
            for_forward,
        };
        self.threads.run("block copies", job, || Ok(()));
        self.pending = for_forward < copies.len();
    }

    /// Block copies applied now on every peer (after any pending ones), as rank 0 applied them.
    pub fn apply_copies(&mut self, copies: &[BlockCopy]) {
        if copies.is_empty() && !self.pending {
            return;
        }
        let shared: Arc<[BlockCopy]> = copies.into();
        self.threads
            .run("block copies", || Job::Copies(shared.clone()), || Ok(()));
        self.pending = false;
    }
}
