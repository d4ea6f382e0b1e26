//! Tensor parallelism on the CUDA executor (`--tensor-parallel-size N`): rank r of N is a
//! whole `CudaBackend` over its shard of the model (`model::shard`) on GPU `ordinals[r]`, with
//! its own KV pool (its KV heads of every block; the scheduler's block ids index every rank's
//! pool, which all have rank 0's block count) and KV host tier. Rank 0 is this backend's own,
//! on the executor thread; ranks 1..N run on threads of their own.
//!
//! Each step every rank runs the same plan: the same persistent-batch changes, block copies and
//! launches. Their forwards meet in the collectives (`collective::TpLink`): after the embedding
//! (each rank holds a slice of the vocabulary's rows), after the o and down projections (each
//! holds a partial sum), and the LM head's slices gathered into whole logits on every rank.
//! Rank 0's sampled tokens are the step's, and the peers record them (`CudaBackend::
//! record_lead`), so the ranks' batches cannot drift apart even where the sampler's draws on
//! equal logits were to differ.
//!
//! The collectives are staged through the host (`collective` module docs), so a world runs
//! eagerly: CUDA graphs, lookahead and verification graphs are off, and the warm-up; the forward
//! itself never takes `residual_gemm` under tensor parallelism (it would add a rank's partial
//! product into the residual before the sum). Speculative decoding is refused. The checkpoint streams one tensor at a time, each
//! cut into the ranks' parts on the way to their GPUs (`GpuWeights::load_split`).
//!
//! A rank that fails or panics aborts the world, which releases ranks waiting in a collective;
//! the step then panics, so the executor actor rebuilds the backend (a world with a rank gone
//! mid-step is in no known state). Dropping the backend joins the peers' threads.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use super::backend::{check_supported, CudaBackend};
use super::collective::TpLink;
use super::device::Gpu;
use super::options::CudaBackendOptions;
use super::weights::GpuWeights;
use crate::executor::backend::{Backend, BackendInfo};
use crate::executor::rank_threads::RankThreads;
use crate::model::config::ModelConfig;
use crate::model::loader::ModelWeights;
use crate::model::shard::{check_split, shard_config, shard_weights};
use crate::parallel::{Communicator, ThreadComm};
use crate::step::{SchedulerOutput, StepOutput};

/// What a peer rank does next.
enum Job {
    /// Follow the step (`CudaBackend::follow`).
    Step(Arc<SchedulerOutput>),
    /// Record rank 0's output of the step just followed.
    Record(Arc<StepOutput>),
}

/// A world of `CudaBackend` ranks behind one `Backend`.
pub struct CudaTpBackend {
    lead: CudaBackend,
    peers: RankThreads<Job>,
    ordinals: Vec<usize>,
}

/// The options every rank runs with: the lead's, less what a host-staged world cannot do.
fn rank_options(opts: &CudaBackendOptions) -> CudaBackendOptions {
    let mut o = opts.clone();
    o.cuda_graphs = false;
    o.verify_graphs = false;
    o.lookahead = false;
    o.lookahead_gate_us = None;
    o.warm_up = false;
    o
}

/// One rank's GPU and its shard's weights there.
type RankParts = (Gpu, GpuWeights);

/// Rank `comm.rank()`'s backend over its GPU (`ordinal`) and shard; `blocks` as
/// `CudaBackend::rank` takes it. Runs on the thread that will use the backend.
fn build_rank(
    cfg: &ModelConfig,
    (gpu, weights): RankParts,
    comm: ThreadComm,
    opts: CudaBackendOptions,
    ordinal: usize,
    blocks: Option<usize>,
) -> anyhow::Result<CudaBackend> {
    let (rank, world) = (comm.rank(), comm.world_size());
    gpu.ctx.bind_to_thread()?;
    let link = TpLink::new(Box::new(comm), cfg.vocab_size);
    let o = CudaBackendOptions {
        device_ordinal: ordinal,
        ..opts
    };
    CudaBackend::rank(gpu, shard_config(cfg, world), weights, o, link, blocks)
        .with_context(|| format!("tensor-parallel rank {rank} on cuda:{ordinal}"))
}

/// Checks that the driver reports the GPUs cuda:first..cuda:first+world-1 for `world` ranks.
pub fn check_devices(first: usize, world: usize) -> anyhow::Result<()> {
    let have = super::device::device_count();
    anyhow::ensure!(
        first + world <= have,
        "--tensor-parallel-size {world} on the GPU needs GPUs cuda:{first}..cuda:{}, and the driver reports {have}; use a smaller size, or --device cpu",
        first + world - 1
    );
    Ok(())
}

/// Checks that `cfg` splits over `world` ranks the CUDA executor can run.
fn check_world(cfg: &ModelConfig, world: usize) -> anyhow::Result<()> {
    check_split(cfg, world)?;
    check_supported(&shard_config(cfg, world))
}

impl CudaTpBackend {
    /// Splits the model folder `dir` over `world` GPUs from `opts.device_ordinal` on, each
    /// checkpoint tensor cut into the ranks' parts as it streams to them
    /// (`GpuWeights::load_split`).
    pub fn load(dir: &Path, opts: CudaBackendOptions, world: usize) -> anyhow::Result<Self> {
        check_devices(opts.device_ordinal, world)?;
        let ordinals: Vec<usize> = (opts.device_ordinal..opts.device_ordinal + world).collect();
        Self::load_on(dir, opts, &ordinals)
    }

    /// `load` with rank r on GPU `ordinals[r]` (tests put several ranks on one GPU).
    pub fn load_on(
        dir: &Path,
        opts: CudaBackendOptions,
        ordinals: &[usize],
    ) -> anyhow::Result<Self> {
        let cfg = ModelConfig::from_dir(dir)?;
        check_world(&cfg, ordinals.len())?;
        let gpus = ordinals
            .iter()
            .map(|&o| Gpu::open(o))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let weights = GpuWeights::load_split(&gpus, &cfg, dir, opts.progress)?;
        Self::start(cfg, gpus.into_iter().zip(weights).collect(), opts, ordinals)
    }

    /// Splits `weights` (the whole model, `cfg`'s shapes) over one rank per entry of
    /// `ordinals` (GPU ordinals; tests put several ranks on one GPU).
    pub fn from_weights(
        cfg: ModelConfig,
        weights: &ModelWeights,
        opts: CudaBackendOptions,
        ordinals: &[usize],
    ) -> anyhow::Result<Self> {
        let world = ordinals.len();
        check_world(&cfg, world)?;
        let rank_cfg = shard_config(&cfg, world);
        let parts = ordinals
            .iter()
            .enumerate()
            .map(|(rank, &o)| -> anyhow::Result<RankParts> {
                let gpu = Gpu::open(o)?;
                let shard = shard_weights(&cfg, weights, rank, world)?;
                let w = GpuWeights::upload(&gpu, &rank_cfg, &shard, false)?;
                Ok((gpu, w))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Self::start(cfg, parts, opts, ordinals)
    }

    /// The world over each rank's GPU and weights (`parts[r]` on GPU `ordinals[r]`).
    fn start(
        cfg: ModelConfig,
        parts: Vec<RankParts>,
        opts: CudaBackendOptions,
        ordinals: &[usize],
    ) -> anyhow::Result<Self> {
        let world = ordinals.len();
        // Each rank's host tier takes the option's bytes.
        crate::executor::host_memory::check(
            "the KV host tiers of all ranks (--cpu-kv-cache-gib per rank)",
            opts.host_kv_cache_bytes * world,
        )?;
        let opts = rank_options(&opts);
        let mut comms = ThreadComm::world(world).into_iter();
        let first = comms.next().context("a world has a rank 0")?;
        let abort = first.abort_handle();
        let mut parts = parts.into_iter();
        let lead_parts = parts.next().context("a world has a rank 0")?;
        // Rank 0 first: its GPU's memory sizes its pool, and every peer takes that many blocks.
        let lead = build_rank(&cfg, lead_parts, first, opts.clone(), ordinals[0], None)?;
        let blocks = lead.info().num_kv_blocks;
        let mut backend = CudaTpBackend {
            lead,
            peers: RankThreads::new(abort),
            ordinals: ordinals.to_vec(),
        };
        for (comm, rank_parts) in comms.zip(parts) {
            let rank = comm.rank();
            let (cfg, opts, ordinal) = (cfg.clone(), opts.clone(), ordinals[rank]);
            // Built on its thread, where its CUDA context is used. Dropping `backend` joins the
            // peers started so far.
            let build = move || build_rank(&cfg, rank_parts, comm, opts, ordinal, Some(blocks));
            backend
                .peers
                .spawn(rank, build, |b: &mut CudaBackend, job| match job {
                    Job::Step(step) => b.follow(step),
                    Job::Record(out) => b.record_lead(out),
                })?;
        }
        Ok(backend)
    }
}

impl Backend for CudaTpBackend {
    fn info(&self) -> BackendInfo {
        let mut info = self.lead.info();
        let on: Vec<String> = self.ordinals.iter().map(|o| format!("cuda:{o}")).collect();
        info.device = format!(
            "{} (tensor parallel: {} ranks on {})",
            info.device,
            self.ordinals.len(),
            on.join(", ")
        );
        info
    }

    /// Every rank runs the step; rank 0's output is returned, after the peers recorded it.
    /// Panics when any rank fails (the actor then rebuilds the backend).
    fn execute(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput> {
        let shared = Arc::new(step.clone());
        let lead = &mut self.lead;
        let out = self
            .peers
            .run("step", || Job::Step(shared.clone()), || lead.execute(step));
        let shared = Arc::new(out.clone());
        let record = || Job::Record(shared.clone());
        self.peers
            .run("step (recording rank 0's tokens)", record, || Ok(()));
        Ok(out)
    }
}
