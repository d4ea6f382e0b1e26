//! `CudaBackend`: the Llama-family forward (every `model::arch` family: q/k/v biases and Qwen3's
//! q/k head norms inside `rope_kv`, sliding windows in both attention kernels, any head size and
//! GQA group through kernels compiled for the model's shape) on the GPU for one flattened paged
//! batch.
//!
//! It keeps the requests in flight in a persistent input batch (`executor::input_batch`): each
//! step applies the scheduler's diffs, builds the flat token arrays once, and hands the forward
//! (`forward`) only the block-table entries that changed since the last step; the device keeps
//! the tables. Batches built by hand (tests, benchmarks) run through `execute_batch` and
//! `forward_logits`, which upload their whole tables.
//!
//! Speculative decoding (`load_speculative`): before the forward the proposer (n-gram lookup,
//! or the draft model on this GPU: `cuda::draft`) proposes for the requests the scheduler gave
//! draft positions; the forward samples each of a verifying sequence's k + 1 rows on the device
//! (lm_head over those rows only), and `executor::verify::DeviceDraws` keeps the draws while
//! they equal the drafts — exact for point-mass proposals, so only token ids come back. A draft
//! model's sampled drafts (dense q) read their rows' logits back for host rejection sampling.
//! Steps with drafts run eagerly, or with `verify_graphs` (opt-in) from a CUDA graph when
//! every sequence verifies the same number of drafts (`step_meta::graph_shape`); never ahead
//! (lookahead cannot predict them). Steps without drafts take exactly the path they took
//! before.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::collective::TpLink;
use super::device::Gpu;
use super::draft::{CudaDraft, DraftParts};
use super::forward::{Forward, KvSizing};
use super::kernels;
use super::kv_tier::{CudaKvTier, KvLayout};
use super::speculation::{check_spec_options, Speculation};
use super::step_meta::GRAPH_BUCKETS;
use super::weights::GpuWeights;
use crate::executor::backend::{Backend, BackendInfo};
use crate::executor::input_batch::{CountOp, InputBatch};
use crate::executor::verify::ForcedAcceptance;
use crate::model::config::ModelConfig;
use crate::model::loader::ModelWeights;
use crate::request::RequestId;
use crate::sampling::params::SamplingParams;
use crate::spec::draft::DraftProposer;
use crate::spec::ngram::NgramProposer;
use crate::spec::{Proposer, SpecConfig, SpecMethod};
use crate::step::{BatchInput, BlockCopy, SampleInput, SchedulerOutput, SpecOutput, StepOutput};

/// Most prompt tokens of `CudaBackend::warm_up`'s prefill.
const WARM_UP_TOKENS: usize = 2048;
/// Context of the decode steps `CudaBackend::warm_up` runs at each batch-size bucket: a short
/// chat's, whose decode split count early steps meet.
const WARM_UP_DECODE_CONTEXT: usize = 128;

/// What `CudaBackend::warm_up` ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmUp {
    /// The dummy prefill's tokens.
    pub prefill_tokens: usize,
    /// The batch sizes of its decode steps at a short context (graph buckets), smallest first;
    /// a batch-1 step after the prefill comes before them.
    pub decode_batches: Vec<usize>,
}

pub use super::forward::kv_bytes_per_block;
pub use super::lookahead::LookaheadStats;
pub use super::options::{pdl_small, skip, CudaBackendOptions};

pub struct CudaBackend {
    fwd: Forward,
    /// The requests in flight; its row r is row r of the device block tables.
    input: InputBatch,
    /// This step's block-table changes, (row · max_blocks + column, block id); reused.
    updates: Vec<(u32, u32)>,
    /// The KV host tier and the copy stream (copy-on-write needs it without a host tier too).
    tier: CudaKvTier,
    /// The last `execute`'s timing (`CudaBackendOptions::step_timing`).
    timing: Option<StepTiming>,
    /// This step's token-count changes (requests with penalties); reused.
    count_ops: Vec<CountOp>,
    /// Speculative decoding's proposer and verification state.
    spec: Speculation,
    /// Bytes of one block of the draft model's pool (0: none), which shares the block ids.
    draft_bytes_per_block: usize,
    /// When the last `execute` returned (gated lookahead weighs an unused step by how long
    /// the GPU then had nothing to do).
    returned: Option<Instant>,
}

/// Where one `execute` spent its time (`CudaBackendOptions::step_timing`, for gpu-bench).
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTiming {
    /// The GPU's global timer (ns) at the start of the step's first kernel and the end of its
    /// last (stamped by `kernels/stamp.cu` inside the step). The gap between one step's end and
    /// the next one's start is the time the GPU waited for the host.
    pub gpu_start_ns: u64,
    pub gpu_end_ns: u64,
    /// Host: applying the plan to the persistent batch and collecting the table changes.
    pub prepare: Duration,
    /// Host: token-count updates, packing, copies, table update and graph launch (with
    /// lookahead, also launching the predicted next step); no forward launch when the step
    /// launched ahead was kept.
    pub launch: Duration,
    /// Host: waiting for the sampled tokens and reading them.
    pub wait: Duration,
    /// The whole `execute`.
    pub total: Duration,
    /// The step was the one launched ahead (lookahead hit).
    pub kept_ahead: bool,
}

impl CudaBackend {
    /// Loads the Hugging Face model folder `dir`, streaming its tensors to the GPU as bf16.
    pub fn load(dir: &Path, opts: CudaBackendOptions) -> anyhow::Result<Self> {
        let cfg = ModelConfig::from_dir(dir)?;
        let gpu = Gpu::open(opts.device_ordinal)?;
        check_supported(&cfg)?;
        let w = GpuWeights::load(&gpu, &cfg, dir, opts.progress)?;
        Self::new(gpu, cfg, w, opts)
    }

    /// As `load`, with the proposer `spec` asks for (`opts.max_drafts` at least its depth; a
    /// draft model is loaded from `spec.draft_model` onto the same device, its compatibility
    /// with the target the caller's to check, `spec::compat`).
    pub fn load_speculative(
        dir: &Path,
        opts: CudaBackendOptions,
        spec: &SpecConfig,
    ) -> anyhow::Result<Self> {
        check_spec_options(&opts, spec)?;
        let cfg = ModelConfig::from_dir(dir)?;
        let gpu = Gpu::open(opts.device_ordinal)?;
        check_supported(&cfg)?;
        let draft = match (spec.method, &spec.draft_model) {
            (SpecMethod::Draft, Some(d)) => {
                let dcfg = ModelConfig::from_dir(d)?;
                check_supported(&dcfg)
                    .map_err(|e| anyhow::anyhow!("draft model {}: {e}", d.display()))?;
                Some(DraftParts::load(d, dcfg, &opts)?)
            }
            (SpecMethod::Draft, None) => anyhow::bail!("--speculative draft needs --draft-model"),
            _ => None,
        };
        let w = GpuWeights::load(&gpu, &cfg, dir, opts.progress)?;
        Self::build(gpu, cfg, w, opts, draft, None)?.with_proposer(spec)
    }

    /// As `synthetic`, with `spec`'s proposer (n-gram only: a synthetic model has no draft).
    pub fn synthetic_speculative(
        cfg: ModelConfig,
        seed: u64,
        opts: CudaBackendOptions,
        spec: &SpecConfig,
    ) -> anyhow::Result<Self> {
        check_spec_options(&opts, spec)?;
        Self::synthetic(cfg, seed, opts)?.with_proposer(spec)
    }

    /// Random weights of `cfg`, with a draft model of random weights of `draft` (the same
    /// vocabulary) beside it: gpu-bench's synthetic draft/target pair.
    pub fn synthetic_with_draft(
        cfg: ModelConfig,
        draft: ModelConfig,
        seed: u64,
        opts: CudaBackendOptions,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            cfg.vocab_size == draft.vocab_size,
            "a draft of vocabulary {} for a target of {}",
            draft.vocab_size,
            cfg.vocab_size
        );
        anyhow::ensure!(opts.max_drafts > 0, "a draft model needs max_drafts > 0");
        check_supported(&cfg)?;
        check_supported(&draft)?;
        let gpu = Gpu::open(opts.device_ordinal)?;
        let w = GpuWeights::random(&gpu, &cfg, seed)?;
        let dgpu = Gpu::open(opts.device_ordinal)?;
        let dw = GpuWeights::random(&dgpu, &draft, seed + 1)?;
        let parts = DraftParts {
            gpu: dgpu,
            cfg: draft,
            weights: dw,
        };
        Self::build(gpu, cfg, w, opts, Some(parts), None)
    }

    /// Benchmarks only (gpu-bench spec; no config or serving path calls it): from now on each
    /// draft is accepted with probability `rate` (seeded by `seed`) instead of by comparison
    /// with the target's draws (`executor::verify::ForcedAcceptance`); None: real
    /// verification again.
    pub fn force_acceptance(&mut self, rate_and_seed: Option<(f64, u64)>) -> anyhow::Result<()> {
        self.spec.forced = match rate_and_seed {
            Some((rate, seed)) => Some(ForcedAcceptance::new(rate, seed)?),
            None => None,
        };
        Ok(())
    }

    /// Sets the proposer of `spec`: none for `off`, n-gram lookup, or the draft model `build`
    /// loaded.
    fn with_proposer(mut self, spec: &SpecConfig) -> anyhow::Result<Self> {
        match spec.method {
            SpecMethod::Off => self.spec.proposer = None,
            SpecMethod::Ngram => {
                self.spec.proposer =
                    Some(Box::new(NgramProposer::new(spec.ngram_min, spec.ngram_max)))
            }
            SpecMethod::Draft => anyhow::ensure!(
                self.spec.proposer.is_some(),
                "--speculative draft without a draft model (a synthetic model has none)"
            ),
        }
        Ok(self)
    }

    /// From weights already in memory (tests).
    pub fn from_weights(
        cfg: ModelConfig,
        weights: &ModelWeights,
        opts: CudaBackendOptions,
    ) -> anyhow::Result<Self> {
        let gpu = Gpu::open(opts.device_ordinal)?;
        check_supported(&cfg)?;
        let w = GpuWeights::upload(&gpu, &cfg, weights, opts.progress)?;
        Self::new(gpu, cfg, w, opts)
    }

    /// Random weights of `cfg`'s shapes, generated on the GPU (synthetic benchmarks).
    pub fn synthetic(
        cfg: ModelConfig,
        seed: u64,
        opts: CudaBackendOptions,
    ) -> anyhow::Result<Self> {
        let gpu = Gpu::open(opts.device_ordinal)?;
        check_supported(&cfg)?;
        let w = GpuWeights::random(&gpu, &cfg, seed)?;
        Self::new(gpu, cfg, w, opts)
    }

    fn new(
        gpu: Gpu,
        cfg: ModelConfig,
        weights: GpuWeights,
        opts: CudaBackendOptions,
    ) -> anyhow::Result<Self> {
        Self::build(gpu, cfg, weights, opts, None, None)
    }

    /// One rank of a tensor-parallel world (`cuda::tp`): `cfg` and `weights` are its shard,
    /// `link` its end of the world; its KV pool has `blocks` blocks (None: what the GPU's
    /// memory allows, as alone).
    pub(super) fn rank(
        gpu: Gpu,
        cfg: ModelConfig,
        weights: GpuWeights,
        opts: CudaBackendOptions,
        link: TpLink,
        blocks: Option<usize>,
    ) -> anyhow::Result<Self> {
        Self::build(gpu, cfg, weights, opts, None, Some((link, blocks)))
    }

    /// The backend, with a draft model's forward beside the target's when `draft` is given:
    /// its activations are allocated first, so that the target's pool is sized after them for
    /// both models' K/V per block, then the draft's pool gets the target's block count.
    fn build(
        gpu: Gpu,
        cfg: ModelConfig,
        weights: GpuWeights,
        opts: CudaBackendOptions,
        draft: Option<DraftParts>,
        rank: Option<(TpLink, Option<usize>)>,
    ) -> anyhow::Result<Self> {
        let host_bytes = opts.host_kv_cache_bytes;
        crate::executor::host_memory::check("the KV host tier (--cpu-kv-cache-gib)", host_bytes)?;
        let draft = match draft {
            Some(d) => {
                let o = d.options(&opts, &cfg);
                Some(Forward::new(
                    d.gpu,
                    d.cfg,
                    d.weights,
                    o,
                    KvSizing::Blocks(1),
                )?)
            }
            None => None,
        };
        let draft_bytes_per_block = draft.as_ref().map_or(0, |d| {
            kv_bytes_per_block(&d.cfg, opts.block_size, opts.kv_cache_dtype)
        });
        let (link, sizing) = match rank {
            Some((link, Some(n))) => (Some(link), KvSizing::Blocks(n)),
            other => (
                other.map(|(link, _)| link),
                KvSizing::Free {
                    shared_bytes: draft_bytes_per_block,
                },
            ),
        };
        let mut fwd = Forward::new(gpu, cfg, weights, opts, sizing)?;
        fwd.tp = link;
        let proposer = match draft {
            Some(mut d) => {
                d.resize_kv(fwd.num_blocks)?;
                tracing::info!(
                    "draft model on the same GPU: its KV pool {} blocks ({:.2} GiB)",
                    fwd.num_blocks,
                    (fwd.num_blocks * draft_bytes_per_block) as f64 / (1u64 << 30) as f64
                );
                let p: Box<dyn Proposer> = Box::new(DraftProposer::new(CudaDraft::new(d)));
                Some(p)
            }
            None => None,
        };
        let layout = fwd.kv_layout();
        let block_bytes = layout.planes * layout.plane_bytes;
        let tier = CudaKvTier::new(&fwd.gpu, &layout, host_bytes / block_bytes)?;
        if tier.num_blocks() > 0 {
            tracing::info!(
                "KV host tier: {} pinned blocks ({:.2} GiB), copies at {:.1} GB/s",
                tier.num_blocks(),
                (tier.num_blocks() * block_bytes) as f64 / (1u64 << 30) as f64,
                tier.bytes_per_s() / 1e9
            );
        }
        let input = InputBatch::new(fwd.opts.block_size, fwd.num_blocks, fwd.max_blocks)
            .with_sliding_window(fwd.cfg.sliding_window)
            .track_table_changes()
            .track_counts_on_device();
        let warm = fwd.opts.warm_up;
        let mut backend = CudaBackend {
            fwd,
            input,
            updates: Vec::new(),
            tier,
            timing: None,
            count_ops: Vec::new(),
            spec: Speculation::new(proposer),
            draft_bytes_per_block,
            returned: None,
        };
        if warm {
            let started = Instant::now();
            match backend.warm_up() {
                Ok(w) => tracing::info!(
                    "CUDA warm-up: a {}-token prefill and decode steps at batch sizes {:?} in {:.0} ms",
                    w.prefill_tokens,
                    w.decode_batches,
                    started.elapsed().as_secs_f64() * 1e3
                ),
                // An optimisation only: the first requests pay what it would have.
                Err(e) => tracing::warn!("CUDA warm-up failed, serving without it: {e:#}"),
            }
        }
        Ok(backend)
    }

    /// A dummy prefill of up to `WARM_UP_TOKENS` tokens, then one decode step after it, then a
    /// decode step at each batch-size bucket of the decode graphs the backend can reach,
    /// outside the persistent batch (`execute_batch`), on blocks from 0 (the pool is all free at
    /// start, and nothing is prefix-cached yet): cuBLAS's and the kernels' first use, and each
    /// bucket's graph capture and first cuBLAS GEMMs at its row count, before the first request
    /// (on an H100 the first decode step at batch 8-256 took 26-35 ms without it and 6-14 with
    /// it, against 6-13 for the next: BENCHMARKS.md, session 28, call 2).
    pub fn warm_up(&mut self) -> anyhow::Result<WarmUp> {
        let bs = self.fwd.opts.block_size;
        let vocab = self.fwd.cfg.vocab_size as u32;
        // The prompt and its one decoded token fit the step, a sequence's blocks and the pool.
        let len = WARM_UP_TOKENS
            .min(self.fwd.max_tokens)
            .min(self.fwd.max_blocks * bs - 1)
            .min(self.fwd.num_blocks * bs - 1);
        anyhow::ensure!(len > 0, "no room for a warm-up prompt");
        let blocks: Vec<u32> = (0..(len + 1).div_ceil(bs) as u32).collect();
        let tokens: Vec<u32> = (0..len as u32).map(|t| (t * 7919) % vocab).collect();
        let sample = |output_index| {
            Some(SampleInput {
                params: Arc::new(SamplingParams::greedy(2)),
                seed: 0,
                output_index,
            })
        };
        let id = RequestId(u64::MAX);
        let mut prefill = BatchInput::default();
        prefill.push_seq(id, &tokens, 0, &blocks, bs, sample(0));
        let first = self.execute_batch(&prefill)?;
        let next = first.sampled.first().map_or(0, |s| s.token);
        let mut decode = BatchInput::default();
        decode.push_seq(id, &[next], len, &blocks, bs, sample(1));
        self.execute_batch(&decode)?;
        // Every bucket, batch 1 again too: a graph is keyed by its split count, which the
        // 2048-token context above does not share with short ones (an H100's first batch-1 step
        // at context 128 after it: 8.6 ms against 5.0). The buckets' sequences all read the
        // prompt's first blocks and write their token into the same slot: the values are
        // dummies, and a graph's shape is the bucket's alone.
        let context = WARM_UP_DECODE_CONTEXT.min(len);
        let table = &blocks[..context.div_ceil(bs)];
        let buckets: Vec<usize> = GRAPH_BUCKETS
            .iter()
            .copied()
            .filter(|&b| b <= self.fwd.max_seqs && b <= self.fwd.max_tokens)
            .collect();
        for &bucket in &buckets {
            let mut decode = BatchInput::default();
            for i in 0..bucket {
                let id = RequestId(u64::MAX - 1 - i as u64);
                decode.push_seq(id, &[next], context - 1, table, bs, sample(1));
            }
            self.execute_batch(&decode)?;
        }
        Ok(WarmUp {
            prefill_tokens: len,
            decode_batches: buckets,
        })
    }

    /// The last `execute`'s timing, with `step_timing` on.
    pub fn last_timing(&self) -> Option<StepTiming> {
        self.timing
    }

    /// What lookahead decode has done so far.
    pub fn lookahead_stats(&self) -> LookaheadStats {
        self.fwd.lookahead_stats
    }

    pub fn config(&self) -> &ModelConfig {
        &self.fwd.cfg
    }

    pub fn gpu(&self) -> &Gpu {
        &self.fwd.gpu
    }

    /// Applies block copies between the tiers now (tests, benchmarks; `execute` applies a
    /// step's own) and waits for them.
    pub fn copy_blocks(&mut self, copies: &[BlockCopy]) -> anyhow::Result<()> {
        self.fwd.gpu.ctx.bind_to_thread()?;
        let layout = self.fwd.kv_layout();
        self.tier
            .apply(&self.fwd.gpu, &layout, copies, copies.len())?;
        self.tier.sync()?;
        self.fwd.gpu.sync()
    }

    /// Host-tier copies gathered through the staging buffer (the default) or per block and
    /// plane (benchmarks compare); returns what is in effect.
    pub fn set_gathered_copies(&mut self, on: bool) -> bool {
        self.tier.set_gathered(on)
    }

    /// Device block `b`'s bytes, planes in order (tests compare tiers with it).
    pub fn kv_block(&self, b: usize) -> anyhow::Result<Vec<u8>> {
        let l = self.fwd.kv_layout();
        // Copies still running under the last forward land first.
        self.tier.sync()?;
        let mut out = vec![0u8; l.planes * l.plane_bytes];
        for (p, chunk) in out.chunks_mut(l.plane_bytes).enumerate() {
            let at = l.base + (p * l.plane_stride + b * l.plane_bytes) as u64;
            self.fwd.gpu.download(chunk, at)?;
        }
        Ok(out)
    }

    /// Verification steps replayed from CUDA graphs so far (`CudaBackendOptions::verify_graphs`):
    /// (all, those padded with dummy verifications).
    pub fn verify_graph_steps(&self) -> (u64, u64) {
        self.fwd.verify_graph_steps
    }

    /// Host-tier block `b`'s bytes (after `copy_blocks`).
    pub fn host_kv_block(&self, b: usize) -> Vec<u8> {
        self.tier.host_block(b, &self.fwd.kv_layout())
    }

    /// The KV pool's layout (benchmarks).
    pub fn kv_layout(&self) -> KvLayout {
        self.fwd.kv_layout()
    }

    /// The copy bandwidth measured at start, bytes per second (0 without a host tier).
    pub fn copy_bytes_per_s(&self) -> f64 {
        self.tier.bytes_per_s()
    }

    pub fn weights(&self) -> &GpuWeights {
        &self.fwd.weights
    }

    /// Runs a batch built by hand and returns the fp32 logits of each sampled sequence, in seq
    /// order (for comparisons with the CPU backend; `execute` never copies logits to the host).
    pub fn forward_logits(&mut self, batch: &BatchInput) -> anyhow::Result<Vec<Vec<f32>>> {
        self.fwd.gpu.ctx.bind_to_thread()?;
        self.whole_tables(batch)?;
        let step = self.fwd.launch(batch, &self.updates, false, false)?;
        self.fwd.logits(step.ns)
    }

    /// Runs a batch built by hand (tests, benchmarks): forward and sampling, on a decode graph
    /// when it is pure decode, outside the persistent input batch of `execute` (which holds the
    /// token counts, so penalties are refused here).
    pub fn execute_batch(&mut self, batch: &BatchInput) -> anyhow::Result<StepOutput> {
        let started = Instant::now();
        self.fwd.gpu.ctx.bind_to_thread()?;
        self.whole_tables(batch)?;
        self.fwd.launch(batch, &self.updates, true, false)?;
        let (rows, top_logprobs) = self.fwd.sampled(batch)?;
        let mut out = StepOutput {
            top_logprobs,
            ..StepOutput::default()
        };
        // Drafts in a hand-built batch are verified as point-mass proposals.
        self.spec.drafts.fill_from_batch(batch);
        self.spec.verify(&self.fwd, batch, rows, &mut out)?;
        out.elapsed = started.elapsed();
        Ok(out)
    }

    /// `updates` := every table entry of a hand-built batch. It overwrites the rows of the
    /// requests in flight, so their tables go up whole with the next `execute`.
    fn whole_tables(&mut self, batch: &BatchInput) -> anyhow::Result<()> {
        let bs = self.fwd.opts.block_size;
        batch
            .validate(bs, self.fwd.num_blocks)
            .and_then(|()| batch.validate_window(bs, self.fwd.cfg.sliding_window))
            .map_err(|e| anyhow::anyhow!("invalid batch: {e}"))?;
        self.updates.clear();
        let width = self.fwd.max_blocks;
        for q in &batch.seqs {
            let table = batch.block_table(q);
            anyhow::ensure!(
                q.row < self.fwd.max_seqs && table.len() <= width,
                "{}: row {} of {} blocks; the CUDA backend has {} rows of {width}",
                q.request_id,
                q.row,
                table.len(),
                self.fwd.max_seqs
            );
            let at = (q.row * width) as u32;
            self.updates
                .extend(table.iter().enumerate().map(|(c, &id)| (at + c as u32, id)));
        }
        self.input.mark_all_changed();
        Ok(())
    }

    /// One scheduler step through the persistent input batch.
    fn step(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput> {
        let started = Instant::now();
        let (spec, prepared, hits) = self.launch_step(step)?;
        let launched = Instant::now();
        let batch = self.input.batch();
        let (rows, top_logprobs) = self.fwd.sampled(batch)?;
        let waited = Instant::now();
        let mut out = StepOutput {
            top_logprobs,
            spec,
            ..StepOutput::default()
        };
        self.spec.verify(&self.fwd, batch, rows, &mut out)?;
        out.elapsed = started.elapsed();
        self.fwd.observe_step(batch, out.elapsed.as_secs_f64());
        self.input.record(&out)?;
        if let Some((gpu_start_ns, gpu_end_ns)) = self.fwd.last_stamps {
            self.timing = Some(StepTiming {
                gpu_start_ns,
                gpu_end_ns,
                prepare: prepared - started,
                launch: launched - prepared,
                wait: waited - launched,
                total: started.elapsed(),
                kept_ahead: self.fwd.lookahead_stats.hits > hits,
            });
        }
        Ok(out)
    }

    /// A tensor-parallel peer's step (`cuda::tp`): the same launches as rank 0's, the
    /// collectives among them, and a wait for the GPU; what it sampled is not used. The lead's
    /// output comes next (`record_lead`), so every rank records the same tokens.
    pub(super) fn follow(&mut self, step: &SchedulerOutput) -> anyhow::Result<()> {
        self.launch_step(step)?;
        self.fwd.sampled(self.input.batch())?;
        Ok(())
    }

    /// A tensor-parallel peer records rank 0's output of the step it followed.
    pub(super) fn record_lead(&mut self, out: &StepOutput) -> anyhow::Result<()> {
        self.input.record(out)
    }

    /// The step up to its launch: the plan applied to the persistent batch, drafts proposed,
    /// block copies, table and count changes, and the forward launched. Returns the proposer's
    /// part of the output, when the host work ended and the lookahead hits before the launch.
    fn launch_step(
        &mut self,
        step: &SchedulerOutput,
    ) -> anyhow::Result<(SpecOutput, Instant, u64)> {
        if let Some(p) = self.spec.proposer.as_mut() {
            for &id in step.finished_req_ids.iter().chain(&step.preempted) {
                p.forget(id);
            }
        }
        // First, before anything can fail: the drops it carries are not sent again.
        self.input.apply(step)?;
        let mut spec = SpecOutput::default();
        self.spec.propose(&self.input, &mut spec)?;
        self.input.build(&self.spec.drafts.proposals)?;
        self.fwd.gpu.ctx.bind_to_thread()?;
        // Copies go out first on their own stream; the forward's stream waits for those it
        // needs (and for the last step's), the rest run under it.
        let layout = self.fwd.kv_layout();
        self.tier.apply(
            &self.fwd.gpu,
            &layout,
            &step.kv_copies,
            step.kv_copies_for_forward,
        )?;
        self.updates.clear();
        let (width, rows) = (self.fwd.max_blocks, self.fwd.max_seqs);
        let updates = &mut self.updates;
        let mut out_of_range = None;
        self.input.drain_table_changes(|r, c, id| {
            if r < rows && c < width {
                updates.push(((r * width + c) as u32, id));
            } else {
                out_of_range = Some(r);
            }
        });
        if let Some(r) = out_of_range {
            anyhow::bail!(
                "{} requests in flight; the CUDA backend has {rows} rows",
                r + 1
            );
        }
        let prepared = Instant::now();
        self.count_ops.clear();
        let ops = &mut self.count_ops;
        self.input.drain_count_ops(|op| ops.push(op));
        self.fwd.apply_count_ops(&self.count_ops)?;
        let batch = self.input.batch();
        let hits = self.fwd.lookahead_stats.hits;
        if self.fwd.opts.lookahead {
            // The count changes were enqueued behind a step launched ahead: never keep it then.
            let counts_changed = !self.count_ops.is_empty();
            let idle_s = self.returned.map_or(0.0, |t| t.elapsed().as_secs_f64());
            self.fwd
                .launch_or_keep(batch, &self.updates, counts_changed, idle_s)?;
            // Behind this step, before waiting for it: the step expected next.
            self.fwd.launch_ahead(batch)?;
        } else {
            self.fwd.launch(batch, &self.updates, true, true)?;
        }
        Ok((spec, prepared, hits))
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> BackendInfo {
        let (major, minor) = self.fwd.gpu.compute_capability;
        BackendInfo {
            device: format!(
                "cuda:{} ({}, sm_{major}{minor})",
                self.fwd.opts.device_ordinal, self.fwd.gpu.name
            ),
            num_kv_blocks: self.fwd.num_blocks,
            block_size: self.fwd.opts.block_size,
            bytes_per_block: kv_bytes_per_block(
                &self.fwd.cfg,
                self.fwd.opts.block_size,
                self.fwd.opts.kv_cache_dtype,
            ) + self.draft_bytes_per_block,
            num_host_blocks: self.tier.num_blocks(),
            copy_bytes_per_s: self.tier.bytes_per_s(),
        }
    }

    fn execute(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput> {
        let res = self.step(step);
        self.returned = Some(Instant::now());
        if res.is_err() {
            // The drained table and count changes may not have reached the device (and the
            // sampler may have counted tokens never recorded): send every row again.
            self.input.mark_all_changed();
            self.input.recount_all();
            // A step launched ahead was predicted from a step that failed.
            self.fwd.drop_ahead();
        }
        res
    }
}

/// Refuses models the CUDA executor cannot run, with the reason (the engine then falls back to
/// the CPU with a warning, or refuses under `--device cuda`).
pub fn check_supported(cfg: &ModelConfig) -> anyhow::Result<()> {
    let group = cfg.num_attention_heads / cfg.num_key_value_heads;
    anyhow::ensure!(
        kernels::attention_supported(cfg.head_dim, group),
        "the CUDA attention kernels take head_dim a multiple of 16 from 16 to 256; this model has head_dim {}",
        cfg.head_dim
    );
    anyhow::ensure!(
        !cfg.o_bias && !cfg.mlp_bias,
        "the CUDA executor has no o-projection or MLP biases (this {} config sets {})",
        cfg.architecture.hf_name(),
        if cfg.mlp_bias {
            "mlp_bias"
        } else {
            "attention_bias"
        }
    );
    anyhow::ensure!(
        cfg.hidden_size <= 8192 && cfg.hidden_size % 8 == 0,
        "the RMSNorm kernel takes hidden sizes up to 8192 that are a multiple of 8; this model has {}",
        cfg.hidden_size
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_supported_takes_every_family_and_names_what_it_refuses() {
        use crate::model::synthetic::{synthetic_config, SYNTHETIC_MODELS};
        for name in SYNTHETIC_MODELS {
            check_supported(&synthetic_config(name).unwrap()).unwrap();
        }
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        for family in ["llama3", "mistral", "qwen2", "qwen3", "phi3"] {
            check_supported(&ModelConfig::from_dir(&fixtures.join(family)).unwrap()).unwrap();
        }
        let mut c = synthetic_config("llama-2-7b").unwrap();
        c.o_bias = true;
        let err = check_supported(&c).unwrap_err().to_string();
        assert!(err.contains("attention_bias"), "{err}");
        let mut c = synthetic_config("llama-2-7b").unwrap();
        c.head_dim = 72;
        let err = check_supported(&c).unwrap_err().to_string();
        assert!(err.contains("head_dim 72"), "{err}");
        let mut c = synthetic_config("llama-2-7b").unwrap();
        c.hidden_size = 12288;
        let err = check_supported(&c).unwrap_err().to_string();
        assert!(err.contains("12288"), "{err}");
    }
}
