//! Wiring: loads the model into a backend, starts the KV-block-manager, executor and scheduler
//! actors, and gives sessions and the bench one handle to submit requests through.
//!
//! Two layers: [`EngineCore`] takes token ids and streams events whose deltas carry token counts
//! (all a synthetic benchmark, which has no tokenizer, needs); [`EngineHandle`] adds the tokenizer
//! and chat template and is what the server takes, so a server without a tokenizer cannot be
//! built.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Arbiter};
use tokio::sync::mpsc;

use crate::chat::ChatTemplate;
use crate::config::Config;
use crate::error::EngineError;
use crate::executor::actor::{BackendFactory, ExecutorActor};
use crate::executor::backend::{Backend, BackendInfo};
use crate::executor::cpu::{CpuBackend, CpuBackendOptions};
use crate::executor::cuda::{self, CudaBackend, CudaBackendOptions, CudaTpBackend};
use crate::executor::null::NullBackend;
use crate::health::Health;
use crate::kv::actor::{KvActor, KvHandle};
use crate::kv::manager::KvCacheManager;
use crate::metrics::Metrics;
use crate::model::config::{GenerationConfig, ModelConfig};
use crate::model::synthetic::{
    synthetic_config, synthetic_config_with_vocab, synthetic_host_weights,
};
use crate::output::Backlog;
use crate::request::{RequestId, StreamEvent};
use crate::scheduler::actor::{Abort, Cancel, SchedulerActor, SchedulerParts, Shutdown, Submit};
use crate::scheduler::SwapCost;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::spec::{compat, SpecMethod};
use crate::tokenizer::Tokenizer;
use crate::validation::{
    GenerateRequest, ModelDefaults, ValidRequest, Validation, ValidationLimits,
};

/// Limits sessions check before a request reaches the scheduler.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    pub max_requests_per_connection: usize,
    pub stream_buffer: usize,
}

#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub model_name: String,
    /// Where the weights came from: the model folder, or "random weights (seed N)".
    pub source: String,
    pub num_parameters: usize,
    /// The model's vocabulary (a tokenizer's may be smaller).
    pub vocab_size: usize,
    pub backend: BackendInfo,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Speculative decoding: off, ngram or draft (with the draft model's folder).
    pub speculative: String,
}

impl EngineInfo {
    pub fn summary(&self) -> String {
        let b = &self.backend;
        format!(
            "model {} ({:.1}M parameters) from {}\ndevice {}\nKV cache: {} blocks x {} tokens = {} tokens ({:.1} MiB)\nscheduler: max_num_seqs {}, max_num_batched_tokens {}, max_model_len {}\nspeculative decoding: {}",
            self.model_name,
            self.num_parameters as f64 / 1e6,
            self.source,
            b.device,
            b.num_kv_blocks,
            b.block_size,
            b.num_kv_blocks * b.block_size,
            (b.num_kv_blocks * b.bytes_per_block) as f64 / (1 << 20) as f64,
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.max_model_len,
            self.speculative,
        )
    }
}

/// The engine at the token level: validate a request, submit it, receive events. Without a
/// tokenizer (a synthetic model) requests are token ids, every delta has empty text and counts
/// the step's tokens, and stop strings are refused.
pub struct EngineCore {
    pub scheduler: Addr<SchedulerActor>,
    pub kv: Addr<KvActor>,
    pub metrics: Arc<Metrics>,
    /// Serving, draining, stalled or failed (`health`): /health, the edge and admission read it.
    pub health: Arc<Health>,
    pub info: EngineInfo,
    pub limits: SessionLimits,
    validation: Validation,
    next_id: AtomicU64,
}

impl EngineCore {
    /// The one admission path (see `validation`): runs on the caller's thread.
    pub fn validate(&self, req: GenerateRequest) -> Result<ValidRequest, EngineError> {
        self.validation.validate(req)
    }

    pub fn validation(&self) -> &Validation {
        &self.validation
    }

    /// Hands a validated request to the scheduler; every event for it arrives on the returned
    /// channel (`overloaded` included).
    /// A request with `n` choices takes the `n` ids from the one returned (choice `i` is
    /// `id + i`, the scheduler's and the output processor's key); the client only ever names
    /// the first.
    pub fn submit(&self, req: ValidRequest) -> (RequestId, mpsc::Receiver<StreamEvent>) {
        self.submit_from(req, None)
    }

    /// [`EngineCore::submit`] for a socket: its output counts against the socket's `backlog`
    /// (unread bytes, bounded; see `output::backlog`).
    pub fn submit_from(
        &self,
        req: ValidRequest,
        backlog: Option<Arc<Backlog>>,
    ) -> (RequestId, mpsc::Receiver<StreamEvent>) {
        let id = RequestId(self.next_id.fetch_add(req.n() as u64, Ordering::Relaxed));
        let (tx, rx) = mpsc::channel(self.limits.stream_buffer);
        self.scheduler.do_send(Submit {
            id,
            request: req,
            tx,
            backlog,
            arrival: Instant::now(),
        });
        (id, rx)
    }

    pub fn cancel(&self, id: RequestId) {
        self.scheduler.do_send(Cancel { id });
    }

    /// Drops requests whose client went away: no events are sent for them.
    pub fn abort(&self, ids: Vec<RequestId>) {
        self.scheduler.do_send(Abort { ids });
    }

    /// Ends the requests left (`shutting_down`) and drops the backend on the executor's
    /// thread; returns once it is gone. Every command that started the engine calls it before
    /// the process exits: a backend still being torn down on its thread while the exit
    /// handlers unloaded the CUDA libraries crashed `brook bench` at exit (session 33).
    pub async fn shutdown(&self) {
        let _ = self.scheduler.send(Shutdown).await;
    }
}

/// Everything a session or the bench needs to talk to a served model: the core (validate,
/// submit, cancel, abort, metrics, info, reached through `Deref`) plus its tokenizer. Cheap to
/// share by Arc.
pub struct EngineHandle {
    core: EngineCore,
    pub tokenizer: Arc<Tokenizer>,
}

impl Deref for EngineHandle {
    type Target = EngineCore;

    fn deref(&self) -> &EngineCore {
        &self.core
    }
}

/// The model folder `brook serve` uses when none is given: the bundled demo model.
pub fn default_model_dir() -> Option<PathBuf> {
    let rel = Path::new("models/demo-chat");
    [
        PathBuf::from(rel),
        Path::new(env!("CARGO_MANIFEST_DIR")).join(rel),
    ]
    .into_iter()
    .find(|p| p.join("config.json").is_file())
}

/// Wraps every backend the engine builds, the first and any rebuilt after a panic: the fault
/// injection tests (tests/common/faults.rs) wrap it in a backend that fails on purpose.
pub type BackendWrap = Arc<dyn Fn(Box<dyn Backend>) -> Box<dyn Backend> + Send + Sync>;

/// Loads the model folder and starts the actors. Must run inside an actix `System`.
pub fn start(cfg: &Config, model_dir: &Path, progress: bool) -> anyhow::Result<Arc<EngineHandle>> {
    start_wrapped(cfg, model_dir, progress, None)
}

/// [`start`], with `wrap` around the backend (see [`BackendWrap`]).
pub fn start_wrapped(
    cfg: &Config,
    model_dir: &Path,
    progress: bool,
    wrap: Option<BackendWrap>,
) -> anyhow::Result<Arc<EngineHandle>> {
    let model_cfg = ModelConfig::from_dir(model_dir)?;
    let text = Text::load(model_dir)?;
    // Checked before the weights load, so a bad default fails fast.
    let defaults = text.defaults(&model_cfg)?;
    let spec = &cfg.speculative;
    if let Some(draft_dir) = spec
        .draft_model
        .as_deref()
        .filter(|_| spec.method == SpecMethod::Draft)
    {
        check_draft(cfg, model_dir, &model_cfg, &text.tokenizer, draft_dir)?;
    }
    let device = pick_device(cfg, &model_cfg)?;
    let load = {
        let (cfg, dir) = (cfg.clone(), model_dir.to_path_buf());
        // A rebuild after a panic shows no progress bar.
        let mut progress = progress;
        // Each call builds the whole backend again, the draft model with its own KV pool too:
        // a rebuilt backend starts with no draft state, the old one's is dropped with it.
        move || -> anyhow::Result<Box<dyn Backend>> {
            let backend: Box<dyn Backend> = match &device {
                Device::Cuda if cfg.model.tensor_parallel_size > 1 => {
                    Box::new(CudaTpBackend::load(
                        &dir,
                        CudaBackendOptions::from_config(&cfg, progress),
                        cfg.model.tensor_parallel_size,
                    )?)
                }
                Device::Cuda => Box::new(CudaBackend::load_speculative(
                    &dir,
                    CudaBackendOptions::from_config(&cfg, progress),
                    &cfg.speculative,
                )?),
                Device::Cpu(_) => Box::new(CpuBackend::load_speculative(
                    &dir,
                    CpuBackendOptions::from_config(&cfg, progress),
                    &cfg.speculative,
                )?),
            };
            progress = false;
            Ok(backend)
        }
    };
    let mut factory = wrapped(load, wrap);
    let backend = factory()?;
    let model = ModelSource {
        name: model_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        source: model_dir.display().to_string(),
        defaults,
        config: model_cfg,
    };
    Ok(text.start(cfg, model, (backend, factory)))
}

/// A model folder's text side: its tokenizer (with generation_config.json's bos/eos ids), chat
/// template and generation config (parsed once: validation takes its sampling defaults).
struct Text {
    tokenizer: Arc<Tokenizer>,
    chat: Option<ChatTemplate>,
    gen: Option<GenerationConfig>,
}

impl Text {
    fn load(dir: &Path) -> anyhow::Result<Self> {
        let gen = GenerationConfig::from_dir(dir)?;
        let tokenizer = Arc::new(Tokenizer::from_dir_with(dir, gen.as_ref())?);
        let chat = ChatTemplate::from_tokenizer(&tokenizer)?;
        Ok(Text {
            tokenizer,
            chat,
            gen,
        })
    }

    /// The sampling defaults for `model`, with every id that ends generation: the tokenizer's
    /// (with generation_config.json's), then config.json's.
    fn defaults(&self, model: &ModelConfig) -> anyhow::Result<ModelDefaults> {
        let mut eos: Vec<u32> = self.tokenizer.eos_token_ids().to_vec();
        for id in &model.eos_token_ids {
            if !eos.contains(id) {
                eos.push(*id);
            }
        }
        ModelDefaults::new(self.gen.as_ref(), eos, model.vocab_size)
    }

    /// Starts the actors serving text through this tokenizer.
    fn start(
        self,
        cfg: &Config,
        model: ModelSource,
        backend: (Box<dyn Backend>, BackendFactory),
    ) -> Arc<EngineHandle> {
        let core = start_actors(cfg, model, backend, Some(self.tokenizer.clone()), self.chat);
        Arc::new(EngineHandle {
            core,
            tokenizer: self.tokenizer,
        })
    }
}

/// Starts the actors on random weights of the synthetic shape `name` (see
/// `model::synthetic`), with no model folder and no tokenizer: requests are token ids. On the GPU
/// the weights are generated there; on the CPU only the small shapes are allowed. Must run
/// inside an actix `System`.
pub fn start_synthetic(cfg: &Config, name: &str, seed: u64) -> anyhow::Result<Arc<EngineCore>> {
    let model_cfg = synthetic_config(name)?;
    let backend = synthetic_factory(cfg, name, &model_cfg, seed, model_cfg.vocab_size)?;
    let model = ModelSource {
        name: name.to_owned(),
        source: format!("random weights (seed {seed})"),
        defaults: ModelDefaults::new(None, model_cfg.eos_token_ids.clone(), model_cfg.vocab_size)?,
        config: model_cfg,
    };
    Ok(Arc::new(start_actors(cfg, model, backend, None, None)))
}

/// Starts the actors around a backend that computes nothing (`executor::null`) but holds the
/// executor thread for `step_time` a step, on the shape of the synthetic model `tiny` (its
/// vocabulary and context): what a step takes beyond `step_time` is the engine's own work.
/// Must run inside an actix `System`.
pub fn start_null(cfg: &Config, step_time: Duration) -> anyhow::Result<Arc<EngineCore>> {
    anyhow::ensure!(
        cfg.speculative.method == SpecMethod::Off,
        "the null backend verifies no drafts: --speculative off"
    );
    let model_cfg = synthetic_config("tiny")?;
    let max_len = resolve_max_model_len(cfg, &model_cfg);
    let (bs, token) = (cfg.cache.block_size, 3);
    // Blocks for every sequence the scheduler may hold at the longest context: nothing is
    // allocated, so the pool never limits the loop.
    let blocks = cfg.scheduler.max_num_seqs.max(1) * max_len.div_ceil(bs) + 1;
    let mut factory: BackendFactory = Box::new(move || {
        let null = NullBackend::new(bs, blocks, max_len, token, step_time);
        Ok(Box::new(null) as Box<dyn Backend>)
    });
    let backend = factory()?;
    let model = ModelSource {
        name: "null".to_owned(),
        source: "no model (the null backend)".to_owned(),
        defaults: ModelDefaults::new(None, model_cfg.eos_token_ids.clone(), model_cfg.vocab_size)?,
        config: model_cfg,
    };
    Ok(Arc::new(start_actors(
        cfg,
        model,
        (backend, factory),
        None,
        None,
    )))
}

/// Refuses a draft model that cannot draft for the target (`spec::compat`), before any weight
/// is loaded.
fn check_draft(
    cfg: &Config,
    target_dir: &Path,
    target: &ModelConfig,
    target_tokenizer: &Tokenizer,
    draft_dir: &Path,
) -> anyhow::Result<()> {
    let draft = ModelConfig::from_dir(draft_dir)
        .map_err(|e| anyhow::anyhow!("draft model {}: {e}", draft_dir.display()))?;
    let draft_tokenizer = if draft_dir.join("tokenizer.json").is_file() {
        Some(Tokenizer::from_dir(draft_dir)?)
    } else {
        None
    };
    compat::check(&compat::Pair {
        target_dir,
        target,
        target_tokenizer: Some(target_tokenizer),
        draft_dir,
        draft: &draft,
        draft_tokenizer: draft_tokenizer.as_ref(),
        max_model_len: resolve_max_model_len(cfg, target),
    })
}

/// The engine's context: the configured one within the model's.
fn resolve_max_model_len(cfg: &Config, model: &ModelConfig) -> usize {
    match cfg.scheduler.max_model_len {
        0 => model.max_position_embeddings,
        n => n.min(model.max_position_embeddings),
    }
}

/// Starts the actors on random weights of the synthetic shape `name` with the tokenizer (and
/// chat template, and generation_config.json if any) of the model folder `tokenizer_dir`: the
/// whole server path (text in, chat template, detokenized text out) on a real shape without
/// its checkpoint. Random weights give arbitrary ids, so the backend samples only the
/// tokenizer's (`synthetic_config_with_vocab` widens a smaller shape vocabulary instead); the
/// text is gibberish, and a request ends at eos as soon as one is drawn unless it sets
/// `ignore_eos`. Must run inside an actix `System`.
pub fn start_synthetic_with_tokenizer(
    cfg: &Config,
    name: &str,
    seed: u64,
    tokenizer_dir: &Path,
) -> anyhow::Result<Arc<EngineHandle>> {
    let text = Text::load(tokenizer_dir)?;
    let vocab = text.tokenizer.vocab_size();
    let model_cfg = synthetic_config_with_vocab(name, vocab)?;
    let defaults = text.defaults(&model_cfg)?;
    let backend = synthetic_factory(cfg, name, &model_cfg, seed, vocab)?;
    let model = ModelSource {
        name: name.to_owned(),
        source: format!(
            "random weights (seed {seed}), tokenizer from {}",
            tokenizer_dir.display()
        ),
        defaults,
        config: model_cfg,
    };
    Ok(text.start(cfg, model, backend))
}

/// The first synthetic backend and the factory that rebuilds it (`synthetic_backend`).
fn synthetic_factory(
    cfg: &Config,
    name: &str,
    model_cfg: &ModelConfig,
    seed: u64,
    sample_vocab: usize,
) -> anyhow::Result<(Box<dyn Backend>, BackendFactory)> {
    let (cfg, model_cfg, name) = (cfg.clone(), model_cfg.clone(), name.to_owned());
    let mut factory = wrapped(
        move || synthetic_backend(&cfg, &name, &model_cfg, seed, sample_vocab),
        None,
    );
    let backend = factory()?;
    Ok((backend, factory))
}

/// Random weights of `model_cfg` (the synthetic shape `name`) in a backend: generated on the
/// GPU, or on the host for the CPU-sized shapes. Only ids below `sample_vocab` are sampled.
fn synthetic_backend(
    cfg: &Config,
    name: &str,
    model_cfg: &ModelConfig,
    seed: u64,
    sample_vocab: usize,
) -> anyhow::Result<Box<dyn Backend>> {
    anyhow::ensure!(
        cfg.speculative.method != SpecMethod::Draft,
        "--speculative draft needs a model folder (a --synthetic model has no draft)"
    );
    Ok(match pick_device(cfg, model_cfg)? {
        Device::Cuda => {
            let opts = CudaBackendOptions {
                sample_vocab_size: sample_vocab,
                ..CudaBackendOptions::from_config(cfg, false)
            };
            Box::new(CudaBackend::synthetic_speculative(
                model_cfg.clone(),
                seed,
                opts,
                &cfg.speculative,
            )?)
        }
        Device::Cpu(why) => {
            let weights = synthetic_host_weights(name, model_cfg, seed)
                .map_err(|e| anyhow::anyhow!("{e} ({why})"))?;
            let opts = CpuBackendOptions::from_config(cfg, false);
            Box::new(
                CpuBackend::from_parts_speculative(
                    model_cfg.clone(),
                    weights,
                    &opts,
                    &cfg.speculative,
                    None,
                )?
                .sample_below(sample_vocab),
            )
        }
    })
}

/// What the actors need to know about the model besides its backend.
struct ModelSource {
    name: String,
    source: String,
    config: ModelConfig,
    defaults: ModelDefaults,
}

/// `load`, then `wrap` around what it built.
fn wrapped(
    mut load: impl FnMut() -> anyhow::Result<Box<dyn Backend>> + Send + 'static,
    wrap: Option<BackendWrap>,
) -> BackendFactory {
    Box::new(move || {
        let backend = load()?;
        Ok(match &wrap {
            Some(w) => w(backend),
            None => backend,
        })
    })
}

/// Starts the KV, executor and scheduler actors around a loaded backend and the factory that
/// rebuilds it after a panic. The scheduler detokenizes with `tokenizer` when there is one, else
/// streams token counts only.
fn start_actors(
    cfg: &Config,
    model: ModelSource,
    (backend, factory): (Box<dyn Backend>, BackendFactory),
    tokenizer: Option<Arc<Tokenizer>>,
    chat: Option<ChatTemplate>,
) -> EngineCore {
    let backend_info = backend.info();
    let model_cfg = &model.config;
    let max_model_len = resolve_max_model_len(cfg, model_cfg);
    if cfg.scheduler.max_model_len > max_model_len {
        tracing::warn!(
            "max_model_len {} is more than the model's {} positions: serving {max_model_len}",
            cfg.scheduler.max_model_len,
            model_cfg.max_position_embeddings
        );
    }
    let metrics = Arc::new(Metrics::new());
    metrics
        .kv_blocks_total
        .set(backend_info.num_kv_blocks as i64);

    let kv: KvHandle = Arc::new(parking_lot::Mutex::new(
        KvCacheManager::new(
            backend_info.num_kv_blocks,
            backend_info.block_size,
            cfg.cache.enable_prefix_caching,
        )
        .with_sliding_window(model_cfg.sliding_window)
        .with_host_tier(backend_info.num_host_blocks)
        .with_block_bytes(backend_info.bytes_per_block),
    ));
    let kv_addr = KvActor::new(kv.clone()).start();
    // The CPU executor's steps use every core: spinning threads would slow them.
    let on_cpu = backend_info.device.starts_with("cpu");
    let prewake = (cfg.scheduler.prewake_us > 0 && !on_cpu)
        .then(|| Duration::from_micros(cfg.scheduler.prewake_us));
    // A thread of its own: a step blocks it. The arbiter runs until the System stops.
    let executor = ExecutorActor::start_in_arbiter(&Arbiter::new().handle(), move |_| {
        ExecutorActor::new(backend, factory, prewake)
    });
    let mut core = Scheduler::new(SchedulerConfig {
        max_model_len,
        ..cfg.scheduler.clone()
    })
    .with_speculation(cfg.speculative.clone());
    if backend_info.num_host_blocks > 0 {
        core.set_swap_cost(Some(SwapCost {
            bytes_per_block: backend_info.bytes_per_block,
            bytes_per_s: backend_info.copy_bytes_per_s,
        }));
        tracing::info!(
            host_blocks = backend_info.num_host_blocks,
            copy_gb_s = backend_info.copy_bytes_per_s / 1e9,
            "KV host tier"
        );
    }
    let limits = ValidationLimits {
        // One output token must still fit in the context window and in the KV pool.
        max_prompt_tokens: max_model_len
            .min(backend_info.num_kv_blocks * backend_info.block_size)
            .saturating_sub(1),
        max_model_len,
        vocab_size: model_cfg.vocab_size,
        max_num_seqs: cfg.scheduler.max_num_seqs,
    };
    let validation = Validation::new(tokenizer.clone(), chat, model.defaults, limits);
    let health = Arc::new(Health::default());
    let step_timeout = (cfg.scheduler.step_timeout_s > 0.0)
        .then(|| Duration::from_secs_f64(cfg.scheduler.step_timeout_s));
    let parts = SchedulerParts {
        kv,
        tokenizer,
        metrics: metrics.clone(),
        health: health.clone(),
        step_timeout,
        prewake,
    };
    // A thread of its own too: its pre-wake polls hold up nothing else, and its per-step work
    // runs away from whatever reads the streams (BENCHMARKS.md, session 33).
    let scheduler = SchedulerActor::start_in_arbiter(&Arbiter::new().handle(), move |_| {
        SchedulerActor::new(core, executor, parts)
    });
    let info = EngineInfo {
        model_name: model.name,
        source: model.source,
        num_parameters: model_cfg.num_parameters(),
        vocab_size: model_cfg.vocab_size,
        backend: backend_info,
        max_model_len,
        max_num_seqs: cfg.scheduler.max_num_seqs,
        max_num_batched_tokens: cfg.scheduler.max_num_batched_tokens,
        speculative: match (&cfg.speculative.method, &cfg.speculative.draft_model) {
            (SpecMethod::Draft, Some(d)) => format!("draft ({})", d.display()),
            (m, _) => m.as_str().to_owned(),
        },
    };
    EngineCore {
        scheduler,
        kv: kv_addr,
        metrics,
        health,
        info,
        limits: SessionLimits {
            max_requests_per_connection: cfg.server.max_requests_per_connection,
            stream_buffer: cfg.server.stream_buffer,
        },
        validation,
        next_id: AtomicU64::new(1),
    }
}

/// Where the backend runs; `Cpu` says why (for messages).
#[derive(Debug, Clone)]
enum Device {
    Cuda,
    Cpu(String),
}

/// `--device auto` (the default) takes the GPU when the CUDA driver loads, reports one and the
/// CUDA executor runs the model, else the CPU: quietly when there is no GPU, with a loud warning
/// when there is one that cannot run this model. `--device cuda` fails with the reason when it
/// cannot.
fn pick_device(cfg: &Config, model: &ModelConfig) -> anyhow::Result<Device> {
    let device = pick_device_for(cfg, model)?;
    let tp = cfg.model.tensor_parallel_size;
    if tp > 1 && matches!(device, Device::Cuda) {
        cuda::tp::check_devices(0, tp)?;
        anyhow::ensure!(
            cfg.speculative.method == SpecMethod::Off,
            "speculative decoding with --tensor-parallel-size {tp} on the GPU is not supported; leave one of them out"
        );
    }
    // Before the weights load: a size that does not fit the model fails fast.
    crate::model::shard::check_split(model, tp)?;
    if let Device::Cpu(why) = &device {
        anyhow::ensure!(
            !cfg.cache.kv_cache_dtype.is_fp8(),
            "--kv-cache-dtype fp8 needs the CUDA executor, and this runs on the CPU ({why}); use --kv-cache-dtype auto"
        );
        anyhow::ensure!(
            !cfg.model.quantization.is_fp8(),
            "--quantization fp8 needs the CUDA executor, and this runs on the CPU ({why}); leave --quantization out"
        );
    }
    Ok(device)
}

fn pick_device_for(cfg: &Config, model: &ModelConfig) -> anyhow::Result<Device> {
    match cfg.model.device.as_str() {
        "cuda" => {
            cuda::probe()
                .map_err(|e| anyhow::anyhow!("--device cuda: {e}; use --device cpu or auto"))?;
            cuda::backend::check_supported(model).map_err(|e| {
                anyhow::anyhow!(
                    "--device cuda: the GPU cannot run this model: {e}; use --device cpu or auto"
                )
            })?;
            Ok(Device::Cuda)
        }
        "auto" => match cuda::probe() {
            Err(e) => {
                tracing::info!("no CUDA device ({e}); running on the CPU");
                Ok(Device::Cpu(format!("--device auto: no CUDA device ({e})")))
            }
            Ok(()) => match cuda::backend::check_supported(model) {
                Ok(()) => Ok(Device::Cuda),
                Err(why) => {
                    tracing::warn!(
                        "A GPU is present but the CUDA executor cannot run this model: {why}. FALLING BACK TO THE CPU executor, which is far slower; --device cuda would refuse, --device cpu silences this warning"
                    );
                    Ok(Device::Cpu(format!("--device auto: {why}")))
                }
            },
        },
        _ => Ok(Device::Cpu("--device cpu".into())),
    }
}
