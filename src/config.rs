//! Engine configuration: a TOML file (configs/brook.toml documents every key), then CLI overrides.

mod backend_options;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::scheduler::SchedulerConfig;
use crate::spec::SpecConfig;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub model: ModelSection,
    pub cache: CacheConfig,
    /// The scheduler's own config: budget, policy (fcfs | adaptive), classes, SLOs, merge,
    /// emergency and admission knobs (src/scheduler/mod.rs).
    pub scheduler: SchedulerConfig,
    /// Speculative decoding: method (off | ngram | draft), draft model, depth ceiling, the
    /// pressure rules (src/spec/config.rs).
    pub speculative: SpecConfig,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Largest WebSocket message, one frame or the sum of a fragmented message's frames; a
    /// larger one closes the socket with code 1009. Also the largest OpenAI API body (413).
    /// (`max_frame_bytes` is its former name.)
    #[serde(alias = "max_frame_bytes")]
    pub max_message_bytes: usize,
    /// Open WebSocket connections at most; beyond it an upgrade gets HTTP 503.
    pub max_connections: usize,
    /// Requests one socket may have in flight; more get `overloaded`.
    pub max_requests_per_connection: usize,
    /// Messages per second one socket may send (token bucket); 0 = no limit. Beyond it a
    /// message gets `rate_limited` with `retry_after_ms`.
    pub rate_limit_per_s: f64,
    /// Burst of messages the bucket allows at once.
    pub rate_limit_burst: u32,
    /// Refused messages in a row after which the socket is closed with 1008; 0 = never.
    pub rate_limit_close_after: u32,
    /// Close a socket that sent no frame (pongs included) for this many seconds; 0 = never.
    pub idle_timeout_s: f64,
    /// Ping every socket this often, in seconds; 0 = never.
    pub ping_interval_s: f64,
    /// Origins allowed to open a WebSocket (`scheme://host[:port]`, or `*`); empty = any.
    /// Requests without an Origin header (non-browser clients) always pass; the server's own
    /// origin must be listed for the bundled chat page.
    pub allowed_origins: Vec<String>,
    /// Serve /metrics without the API key even when one is set.
    pub public_metrics: bool,
    /// Set from `--api-key` / `BROOK_API_KEY` only, never from a file (secrets stay out of
    /// configs); `None` = no authentication.
    #[serde(skip)]
    pub api_key: Option<crate::access::ApiKey>,
    /// Capacity of each request's event channel to its session (events, not tokens: deltas
    /// are merged while the channel is full, so this bounds memory without blocking the engine).
    pub stream_buffer: usize,
    /// Output bytes a socket may leave unread (produced for its requests, not yet taken because
    /// the client stopped reading); past it its requests end with `slow_consumer` and the
    /// socket closes with 1008. Bounds a slow client's memory besides actix's ~32 KiB buffer.
    pub max_unread_bytes: usize,
    /// Seconds a socket past `max_unread_bytes` gets to take its error frames and close frame;
    /// after that the connection is cut (a client that never reads holds no slot for ever).
    pub slow_consumer_grace_s: f64,
    /// SO_SNDBUF of accepted connections, bytes; 0 = the OS's (autotuned). A small one bounds
    /// the kernel memory a client that stops reading holds.
    pub socket_send_buffer_bytes: usize,
    /// On SIGTERM or Ctrl-C: seconds the requests accepted before get to finish (new ones get
    /// `shutting_down`); those left then end with `shutting_down`, and the process exits 0.
    pub shutdown_timeout_s: f64,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// Hugging Face model folder; empty = the bundled demo model.
    pub path: Option<PathBuf>,
    /// auto | cpu | cuda
    pub device: String,
    /// CPU executor threads; 0 = all cores.
    pub cpu_threads: usize,
    /// Ranks the model is split over (Megatron-style tensor parallelism; 1 = none). The CPU
    /// executor runs the ranks on threads of one process; the CUDA executor one rank a GPU,
    /// its collectives staged through host memory (NCCL is not built).
    pub tensor_parallel_size: usize,
    /// CUDA executor: prefill sequences whose context has at most this many tokens run
    /// attention as cuBLAS GEMMs, longer ones on the flash kernel; 0 = flash only.
    pub prefill_gemm_max_len: usize,
    /// CUDA executor: replay speculative verification steps (every sequence verifying the same
    /// number of drafts) from CUDA graphs as decode steps are. Off by default until measured.
    pub cuda_verify_graphs: bool,
    /// CUDA executor: before serving, run a dummy prefill and decode step, so that the first
    /// requests do not pay cuBLAS's and the kernels' first use or the batch-1 graph's capture.
    /// On by default: measured (H100, `gpu-bench cold`), the first 2048-token prefill takes
    /// 48 ms instead of 166, for 0.22 s more at start.
    pub cuda_warm_up: bool,
    /// CUDA executor: the linear layers' weights, none (bf16) or fp8 (e4m3 with one scale per
    /// matrix, fp8 GEMMs; sm_89+). The CPU executor refuses fp8 at start.
    pub quantization: crate::executor::cuda::Quantization,
    /// CUDA executor: the decode attention kernel, auto (tensor cores for grouped-query models
    /// and fp8 KV caches, the CUDA-core lane kernel for MHA over bf16, as measured), lanes or mma
    /// (tensor cores; head dims up to 128, else lanes). The CPU executor has one attention and
    /// ignores it.
    pub decode_attention: crate::executor::cuda::DecodeKernel,
    /// CUDA executor: lookahead decode, off, on (after a step in which every sequence samples,
    /// launch the decode step predicted to follow before the host has the plan) or auto (only
    /// while a gate finds that the host time it hides outweighs the steps it wastes). Auto by
    /// default (`executor::cuda::LookaheadMode`).
    pub cuda_lookahead: crate::executor::cuda::LookaheadMode,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    pub block_size: usize,
    /// KV cache size on the CPU executor, in MiB.
    pub kv_cache_mib: usize,
    /// Fraction of GPU memory the CUDA executor may use (weights + KV).
    pub gpu_memory_utilization: f64,
    pub enable_prefix_caching: bool,
    /// KV host tier in CPU memory, GiB (pinned on CUDA; 0 = none): evicted prefix blocks and
    /// swapped-out requests go there (`--cpu-kv-cache-gib`).
    pub cpu_kv_cache_gib: f64,
    /// Copy bandwidth between the tiers for the swap-or-recompute decision, GB/s; 0 = measure
    /// at start.
    pub swap_bandwidth_gbs: f64,
    /// KV cache element type: auto (the model's dtype), bf16, or fp8 (e4m3, scale 1; CUDA
    /// executor on sm_89+ only: the CPU executor refuses it at start).
    pub kv_cache_dtype: crate::executor::cuda::KvCacheDtype,
}

impl CacheConfig {
    /// The host tier's size in bytes.
    pub fn cpu_kv_cache_bytes(&self) -> usize {
        (self.cpu_kv_cache_gib * (1u64 << 30) as f64) as usize
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            max_message_bytes: 1 << 20,
            max_connections: 1024,
            max_requests_per_connection: 64,
            rate_limit_per_s: 50.0,
            rate_limit_burst: 100,
            rate_limit_close_after: 200,
            idle_timeout_s: 60.0,
            ping_interval_s: 10.0,
            allowed_origins: Vec::new(),
            public_metrics: false,
            api_key: None,
            stream_buffer: 16,
            max_unread_bytes: 1 << 20,
            slow_consumer_grace_s: 5.0,
            socket_send_buffer_bytes: 0,
            shutdown_timeout_s: 30.0,
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: None,
            device: "auto".into(),
            cpu_threads: 0,
            tensor_parallel_size: 1,
            // Measured: the flash kernel beat the GEMM path everywhere (BENCHMARKS.md).
            prefill_gemm_max_len: 0,
            cuda_verify_graphs: false,
            cuda_warm_up: true,
            quantization: Default::default(),
            decode_attention: Default::default(),
            cuda_lookahead: Default::default(),
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            block_size: 16,
            kv_cache_mib: 256,
            gpu_memory_utilization: 0.90,
            enable_prefix_caching: true,
            cpu_kv_cache_gib: 0.0,
            swap_bandwidth_gbs: 0.0,
            kv_cache_dtype: Default::default(),
        }
    }
}

impl ServerConfig {
    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.stream_buffer >= 2, "server.stream_buffer must be >= 2");
        anyhow::ensure!(
            self.max_message_bytes >= 1024,
            "server.max_message_bytes must be >= 1024, got {}",
            self.max_message_bytes
        );
        anyhow::ensure!(
            self.max_connections >= 1 && self.max_requests_per_connection >= 1,
            "server.max_connections and server.max_requests_per_connection must be >= 1"
        );
        let secs = |name: &str, v: f64| {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "server.{name} must be a number >= 0 (0 = off), got {v}"
            );
            Ok(())
        };
        secs("rate_limit_per_s", self.rate_limit_per_s)?;
        secs("idle_timeout_s", self.idle_timeout_s)?;
        secs("ping_interval_s", self.ping_interval_s)?;
        secs("slow_consumer_grace_s", self.slow_consumer_grace_s)?;
        secs("shutdown_timeout_s", self.shutdown_timeout_s)?;
        anyhow::ensure!(
            self.max_unread_bytes >= 1024,
            "server.max_unread_bytes must be >= 1024, got {}",
            self.max_unread_bytes
        );
        anyhow::ensure!(
            self.rate_limit_per_s == 0.0 || self.rate_limit_burst >= 1,
            "server.rate_limit_burst must be >= 1 when rate_limit_per_s is set"
        );
        anyhow::ensure!(
            self.idle_timeout_s == 0.0
                || self.ping_interval_s == 0.0
                || self.ping_interval_s < self.idle_timeout_s,
            "server.ping_interval_s ({}) must be below idle_timeout_s ({}), or live clients \
             would be closed as idle",
            self.ping_interval_s,
            self.idle_timeout_s
        );
        crate::access::AllowedOrigins::parse(&self.allowed_origins)
            .map_err(|e| anyhow::anyhow!("server.allowed_origins: {e}"))?;
        Ok(())
    }
}

impl Config {
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
        Self::from_toml(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))
    }

    pub fn from_toml(text: &str) -> anyhow::Result<Self> {
        let cfg: Config = toml::from_str(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        const MAX_CPU_THREADS: usize = 1024;
        const MAX_TENSOR_PARALLEL: usize = 64;
        let c = &self.cache;
        anyhow::ensure!(
            c.block_size.is_power_of_two() && c.block_size <= 256,
            "cache.block_size must be a power of two <= 256, got {}",
            c.block_size
        );
        anyhow::ensure!(c.kv_cache_mib > 0, "cache.kv_cache_mib must be > 0");
        anyhow::ensure!(
            self.model.cpu_threads <= MAX_CPU_THREADS,
            "model.cpu_threads (--cpu-threads) must be at most {MAX_CPU_THREADS}, got {} (0: all cores)",
            self.model.cpu_threads
        );
        anyhow::ensure!(
            (1..=MAX_TENSOR_PARALLEL).contains(&self.model.tensor_parallel_size),
            "model.tensor_parallel_size (--tensor-parallel-size) must be 1 to {MAX_TENSOR_PARALLEL}, got {}",
            self.model.tensor_parallel_size
        );
        anyhow::ensure!(
            c.cpu_kv_cache_gib.is_finite() && c.cpu_kv_cache_gib >= 0.0,
            "cache.cpu_kv_cache_gib must be >= 0, got {}",
            c.cpu_kv_cache_gib
        );
        anyhow::ensure!(
            c.swap_bandwidth_gbs.is_finite() && c.swap_bandwidth_gbs >= 0.0,
            "cache.swap_bandwidth_gbs must be >= 0, got {}",
            c.swap_bandwidth_gbs
        );
        anyhow::ensure!(
            c.gpu_memory_utilization > 0.0 && c.gpu_memory_utilization <= 1.0,
            "cache.gpu_memory_utilization must be in (0, 1], got {}",
            c.gpu_memory_utilization
        );
        // max_model_len 0 means "the model's", resolved at start; check the rest as given.
        let mut sched = self.scheduler.clone();
        sched.max_model_len = sched.max_model_len.max(1);
        sched
            .validate()
            .map_err(|e| anyhow::anyhow!("scheduler.{e}"))?;
        anyhow::ensure!(
            sched.max_num_batched_tokens >= sched.max_num_seqs,
            "scheduler.max_num_batched_tokens ({}) must be >= max_num_seqs ({})",
            sched.max_num_batched_tokens,
            sched.max_num_seqs
        );
        anyhow::ensure!(
            ["auto", "cpu", "cuda"].contains(&self.model.device.as_str()),
            "model.device must be auto, cpu or cuda, got {:?}",
            self.model.device
        );
        self.server.validate()?;
        self.speculative
            .validate()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error `text` is refused with.
    fn toml_err(text: &str) -> String {
        Config::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn bundled_default_config_parses_and_equals_defaults() {
        let text = include_str!("../configs/brook.toml");
        let cfg = Config::from_toml(text).unwrap();
        assert_eq!(cfg, Config::default());
    }

    /// The backends take every shared knob from the config, and their defaults are the
    /// config's defaults (there is no second set of literals to drift, e.g. max_num_seqs).
    #[test]
    fn backend_options_come_from_the_config() {
        use crate::executor::cpu::CpuBackendOptions;
        use crate::executor::cuda::CudaBackendOptions;
        let mut cfg = Config::default();
        cfg.cache.block_size = 32;
        cfg.cache.kv_cache_mib = 7;
        cfg.cache.gpu_memory_utilization = 0.5;
        cfg.scheduler.max_num_seqs = 9;
        cfg.scheduler.max_num_batched_tokens = 99;
        cfg.scheduler.max_model_len = 999;
        cfg.model.prefill_gemm_max_len = 128;
        cfg.model.cpu_threads = 3;
        let cuda = CudaBackendOptions::from_config(&cfg, false);
        assert_eq!(
            (
                cuda.block_size,
                cuda.gpu_memory_utilization,
                cuda.max_num_seqs
            ),
            (32, 0.5, 9)
        );
        assert_eq!(
            (
                cuda.max_num_batched_tokens,
                cuda.max_model_len,
                cuda.prefill_gemm_max_len
            ),
            (99, 999, 128)
        );
        let cpu = CpuBackendOptions::from_config(&cfg, false);
        assert_eq!(
            (cpu.block_size, cpu.kv_cache_bytes, cpu.num_threads),
            (32, 7 << 20, Some(3))
        );

        let d = Config::default();
        let cuda = CudaBackendOptions::default();
        assert_eq!(cuda.max_num_seqs, d.scheduler.max_num_seqs);
        assert_eq!(
            cuda.max_num_batched_tokens,
            d.scheduler.max_num_batched_tokens
        );
        assert_eq!(cuda.block_size, d.cache.block_size);
        assert_eq!(cuda.prefill_gemm_max_len, d.model.prefill_gemm_max_len);
        let cpu = CpuBackendOptions::default();
        assert_eq!(cpu.kv_cache_bytes, d.cache.kv_cache_mib << 20);
        assert_eq!(cpu.num_threads, None);
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let err = toml_err("[cache]\nblok_size = 8\n");
        assert!(err.contains("blok_size"), "{err}");
    }

    #[test]
    fn server_keys_former_name_and_cross_checks() {
        let cfg = Config::from_toml("[server]\nmax_frame_bytes = 2048\n").unwrap();
        assert_eq!(cfg.server.max_message_bytes, 2048);
        let err = toml_err("[server]\nidle_timeout_s = 5.0\nping_interval_s = 5.0\n");
        assert!(err.contains("ping_interval_s"), "{err}");
        let err = toml_err("[server]\napi_key = \"0123456789abcdef\"\n");
        assert!(err.contains("api_key"), "keys never come from files: {err}");
        let err = toml_err("[server]\nallowed_origins = [\"example.com\"]\n");
        assert!(err.contains("allowed_origins"), "{err}");
    }

    #[test]
    fn speculative_section_parses_and_is_checked() {
        let cfg = Config::from_toml(
            "[speculative]\nmethod = \"draft\"\ndraft_model = \"models/demo-chat-draft\"\nmax_depth = 3\n",
        )
        .unwrap();
        assert_eq!(cfg.speculative.method, crate::spec::SpecMethod::Draft);
        assert_eq!(cfg.speculative.max_depth, 3);
        let err = toml_err("[speculative]\nmethod = \"draft\"\n");
        assert!(err.contains("draft_model"), "{err}");
        let err = toml_err("[speculative]\nmethod = \"ngram\"\nmax_depth = 0\n");
        assert!(err.contains("max_depth"), "{err}");
    }

    /// The `[model]` switch `key` and its CLI `flag` reach the CUDA option `get` reads; off by
    /// default (the opt-in switches, until measured).
    fn cuda_switch_flows(
        key: &str,
        flag: &str,
        get: fn(&crate::executor::cuda::CudaBackendOptions) -> bool,
    ) {
        use crate::executor::cuda::CudaBackendOptions;
        use clap::Parser;
        assert!(!get(&CudaBackendOptions::from_config(
            &Config::default(),
            false
        )));
        let cfg = Config::from_toml(&format!("[model]\n{key} = true\n")).unwrap();
        assert!(get(&CudaBackendOptions::from_config(&cfg, false)), "{key}");
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            engine: crate::engine_args::EngineArgs,
        }
        let on = Cli::parse_from(["brook", flag]).engine;
        let off = Cli::parse_from(["brook"]).engine;
        let set = |e: &crate::engine_args::EngineArgs| {
            get(&CudaBackendOptions::from_config(
                &e.resolve().unwrap(),
                false,
            ))
        };
        assert_eq!((set(&on), set(&off)), (true, false), "{flag}");
    }

    /// `model.cuda_verify_graphs` and `--cuda-verify-graphs` reach the CUDA options.
    #[test]
    fn cuda_verify_graphs_flows_to_the_cuda_options() {
        cuda_switch_flows("cuda_verify_graphs", "--cuda-verify-graphs", |o| {
            o.verify_graphs
        });
    }

    /// `model.cuda_warm_up` (on by default) and `--cuda-warm-up [true|false]` reach the CUDA
    /// options.
    #[test]
    fn cuda_warm_up_flows_to_the_cuda_options() {
        use crate::executor::cuda::CudaBackendOptions;
        use clap::Parser;
        let warm = |cfg: &Config| CudaBackendOptions::from_config(cfg, false).warm_up;
        assert!(warm(&Config::default()));
        assert!(!warm(
            &Config::from_toml("[model]\ncuda_warm_up = false\n").unwrap()
        ));
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            engine: crate::engine_args::EngineArgs,
        }
        let flag = |args: &[&str]| {
            let e = Cli::parse_from(std::iter::once("brook").chain(args.iter().copied())).engine;
            warm(&e.resolve().unwrap())
        };
        assert!(flag(&[]));
        assert!(flag(&["--cuda-warm-up"]));
        assert!(!flag(&["--cuda-warm-up", "false"]));
        assert!(flag(&["--cuda-warm-up", "true"]));
    }

    /// `cache.kv_cache_dtype` (and `--kv-cache-dtype`) reach the CUDA options; the CPU
    /// executor refuses fp8 at start, before loading weights, saying what to do.
    #[test]
    fn kv_cache_dtype_flows_to_cuda_and_the_cpu_refuses_fp8() {
        use crate::executor::cuda::{CudaBackendOptions, KvCacheDtype};
        assert_eq!(Config::default().cache.kv_cache_dtype, KvCacheDtype::Auto);
        let cfg = Config::from_toml("[cache]\nkv_cache_dtype = \"fp8\"\n").unwrap();
        assert_eq!(cfg.cache.kv_cache_dtype, KvCacheDtype::Fp8);
        let cuda = CudaBackendOptions::from_config(&cfg, false);
        assert_eq!(cuda.kv_cache_dtype, KvCacheDtype::Fp8);
        assert_eq!(
            (
                KvCacheDtype::Auto.cuda_bytes(),
                KvCacheDtype::Bf16.cuda_bytes()
            ),
            (2, 2)
        );
        assert_eq!(KvCacheDtype::Fp8.cuda_bytes(), 1);
        let err = toml_err("[cache]\nkv_cache_dtype = \"fp16\"\n");
        assert!(err.contains("fp16"), "{err}");

        let err = cpu_start_error(cfg);
        assert!(
            err.contains("--kv-cache-dtype fp8") && err.contains("CPU"),
            "{err}"
        );
    }

    /// The error of starting the demo model on the CPU executor with `cfg`, which must fail.
    fn cpu_start_error(mut cfg: Config) -> String {
        cfg.model.device = "cpu".into();
        let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/demo-chat");
        match crate::engine::start(&cfg, &demo, false) {
            Ok(_) => panic!("the CPU executor started with {cfg:?}"),
            Err(e) => format!("{e:#}"),
        }
    }

    /// `model.quantization` (and `--quantization`) reach the CUDA options; the CPU refuses fp8.
    #[test]
    fn quantization_flows_to_cuda_and_the_cpu_refuses_fp8() {
        use crate::executor::cuda::{CudaBackendOptions, Quantization};
        assert_eq!(Config::default().model.quantization, Quantization::None);
        let cfg = Config::from_toml("[model]\nquantization = \"fp8\"\n").unwrap();
        assert_eq!(cfg.model.quantization, Quantization::Fp8);
        let cuda = CudaBackendOptions::from_config(&cfg, false);
        assert_eq!(cuda.quantization, Quantization::Fp8);
        let err = toml_err("[model]\nquantization = \"int4\"\n");
        assert!(err.contains("int4"), "{err}");
        let err = cpu_start_error(cfg);
        assert!(
            err.contains("--quantization fp8") && err.contains("CPU"),
            "{err}"
        );
    }

    /// `model.decode_attention` (and `--decode-attention`) reach the CUDA options.
    #[test]
    fn decode_attention_flows_to_cuda() {
        use crate::executor::cuda::{CudaBackendOptions, DecodeKernel};
        assert_eq!(Config::default().model.decode_attention, DecodeKernel::Auto);
        let cfg = Config::from_toml("[model]\ndecode_attention = \"lanes\"\n").unwrap();
        let cuda = CudaBackendOptions::from_config(&cfg, false);
        assert_eq!(cuda.decode_kernel, DecodeKernel::Lanes);
        let err = toml_err("[model]\ndecode_attention = \"flash\"\n");
        assert!(err.contains("flash"), "{err}");
    }

    /// `model.cuda_lookahead` (and `--cuda-lookahead`) reach the CUDA options: auto by default,
    /// on launches every prediction, auto gates them.
    #[test]
    fn cuda_lookahead_flows_to_cuda() {
        use crate::executor::cuda::{lookahead, CudaBackendOptions};
        let opts = |toml: &str| {
            let o = CudaBackendOptions::from_config(&Config::from_toml(toml).unwrap(), false);
            (o.lookahead, o.lookahead_gate_us)
        };
        assert_eq!(
            opts(""),
            (true, Some(lookahead::DEFAULT_GAIN_US)),
            "auto by default"
        );
        assert_eq!(opts("[model]\ncuda_lookahead = \"off\"\n"), (false, None));
        assert_eq!(opts("[model]\ncuda_lookahead = \"on\"\n"), (true, None));
        assert_eq!(
            opts("[model]\ncuda_lookahead = \"auto\"\n"),
            (true, Some(lookahead::DEFAULT_GAIN_US))
        );
        let err = toml_err("[model]\ncuda_lookahead = \"always\"\n");
        assert!(err.contains("always"), "{err}");
    }

    #[test]
    fn bad_value_is_rejected() {
        let err = toml_err("[cache]\nblock_size = 12\n");
        assert!(err.contains("block_size"), "{err}");
    }
}
