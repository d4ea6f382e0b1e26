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

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;
use crossbeam_channel::{bounded, Receiver, Sender};

use crate::executor::actor::panic_message;
use crate::executor::kv_tier::CpuHostTier;
use crate::model::config::ModelConfig;
use crate::model::llama::{KvPool, LlamaModel, TpRank};
use crate::model::loader::ModelWeights;
use crate::model::shard::{shard_config, shard_weights, vocab_rows};
use crate::parallel::{AbortHandle, CommAborted, Communicator, ThreadComm};
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

/// A peer's failed job: why, and whether it failed on its own (`cause`) rather than because
/// another rank aborted the world.
struct Failure {
    cause: bool,
    why: String,
}

/// How a peer's job ended.
enum Done {
    Ok,
    /// `aborted`: the failure was another rank's abort reaching this one.
    Failed {
        why: String,
        aborted: bool,
    },
    Panicked(String),
}

/// One peer rank's thread and its two channels (one job in flight at a time: bounded at 1).
struct Peer {
    rank: usize,
    jobs: Sender<Job>,
    done: Receiver<Done>,
    thread: JoinHandle<()>,
}

/// Ranks 1..N of a world whose rank 0 is the caller's model.
pub struct TpPeers {
    peers: Vec<Peer>,
    abort: AbortHandle,
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
        let mut peers = Vec::with_capacity(world - 1);
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
            let (jobs, job_rx) = bounded(1);
            let (done_tx, done) = bounded(1);
            let thread = std::thread::Builder::new()
                .name(format!("brook-tp{rank}"))
                .spawn(move || run_rank(model, kv, host, pool, job_rx, done_tx))
                .context("starting a tensor-parallel rank's thread")?;
            peers.push(Peer {
                rank,
                jobs,
                done,
                thread,
            });
        }
        Ok(TpWorld {
            rank0,
            peers: TpPeers {
                peers,
                abort,
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

/// A peer rank's loop: one job at a time until the backend drops its channel.
fn run_rank(
    model: LlamaModel,
    mut kv: KvPool,
    mut host: Option<CpuHostTier>,
    pool: rayon::ThreadPool,
    jobs: Receiver<Job>,
    done: Sender<Done>,
) {
    while let Ok(job) = jobs.recv() {
        let run = catch_unwind(AssertUnwindSafe(|| match &job {
            Job::Forward(batch) => pool.install(|| model.forward(batch, &mut kv)).map(drop),
            Job::StepCopies {
                copies,
                for_forward,
            } => match &mut host {
                Some(h) => h.apply_step(&mut kv, copies, *for_forward),
                None => CpuHostTier::apply_on_device(&mut kv, copies),
            },
            Job::Copies(copies) => match &mut host {
                Some(h) => h.apply(&mut kv, copies),
                None => CpuHostTier::apply_on_device(&mut kv, copies),
            },
            #[cfg(test)]
            Job::Panic => panic!("injected"),
        }));
        let end = match run {
            Ok(Ok(())) => Done::Ok,
            Ok(Err(e)) => Done::Failed {
                why: format!("{e:#}"),
                aborted: e.chain().any(|c| c.is::<CommAborted>()),
            },
            Err(p) => Done::Panicked(panic_message(&*p)),
        };
        if !matches!(end, Done::Ok) {
            // Rank 0 and the others may be waiting in a collective this rank will not reach.
            model.abort_collectives("a peer rank failed");
        }
        if done.send(end).is_err() {
            break;
        }
    }
}

impl TpPeers {
    /// Ranks in the world, rank 0 included.
    pub fn world_size(&self) -> usize {
        self.peers.len() + 1
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
        self.post(|| {
            #[cfg(test)]
            if inject {
                return Job::Panic;
            }
            Job::Forward(shared.clone())
        });
        let mine = rank0();
        if mine.is_err() {
            self.abort.abort("rank 0 failed");
        }
        let theirs = self.collect();
        // The failure that caused the others: a peer's own, else rank 0's, else any.
        let cause = theirs.iter().find(|f| f.cause).map(|f| f.why.clone());
        match (mine, cause, theirs.first()) {
            (Ok(logits), None, None) => logits,
            (_, Some(why), _) => panic!("tensor-parallel step failed: {why}"),
            (Err(e), None, _) => panic!("tensor-parallel step failed: rank 0: {e:#}"),
            (Ok(_), None, Some(f)) => panic!("tensor-parallel step failed: {}", f.why),
        }
    }

    /// A step's block copies on every peer, as rank 0 applied them (which checked them): the
    /// first `for_forward` now, the rest at the next step, as `CpuHostTier::apply_step` does.
    pub fn step_copies(&mut self, copies: &[BlockCopy], for_forward: usize) {
        if copies.is_empty() && !self.pending {
            return;
        }
        let shared: Arc<[BlockCopy]> = copies.into();
        self.run_copies(|| Job::StepCopies {
            copies: shared.clone(),
            for_forward,
        });
        self.pending = for_forward < copies.len();
    }

    /// Block copies applied now on every peer (after any pending ones), as rank 0 applied them.
    pub fn apply_copies(&mut self, copies: &[BlockCopy]) {
        if copies.is_empty() && !self.pending {
            return;
        }
        let shared: Arc<[BlockCopy]> = copies.into();
        self.run_copies(|| Job::Copies(shared.clone()));
        self.pending = false;
    }

    fn run_copies(&self, job: impl Fn() -> Job) {
        self.post(job);
        if let Some(f) = self.collect().first() {
            panic!("tensor-parallel block copies failed: {}", f.why);
        }
    }

    fn post(&self, job: impl Fn() -> Job) {
        for p in &self.peers {
            // A peer's thread ends only with the channel, or by a bug: `collect` reports it.
            let _ = p.jobs.send(job());
        }
    }

    /// Waits for every peer's job; their failures, in rank order.
    fn collect(&self) -> Vec<Failure> {
        let mut failures = Vec::new();
        for p in &self.peers {
            let (cause, why) = match p.done.recv() {
                Ok(Done::Ok) => continue,
                Ok(Done::Panicked(m)) => (true, format!("rank {} panicked: {m}", p.rank)),
                Ok(Done::Failed { why, aborted }) => (!aborted, format!("rank {}: {why}", p.rank)),
                Err(_) => (true, format!("rank {}'s thread is gone", p.rank)),
            };
            failures.push(Failure { cause, why });
        }
        failures
    }
}

impl Drop for TpPeers {
    /// Releases peers waiting in a collective (rank 0 panicked mid-step), closes their channels
    /// and joins their threads.
    fn drop(&mut self) {
        self.abort.abort("the backend is shutting down");
        for Peer {
            rank,
            jobs,
            done,
            thread,
        } in self.peers.drain(..)
        {
            drop((jobs, done));
            if thread.join().is_err() {
                tracing::error!("tensor-parallel rank {rank}'s thread panicked");
            }
        }
    }
}
