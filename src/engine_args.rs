//! Engine flags shared by `brook serve` and `brook bench`, applied over the config file.
//! Kept apart from `cli` so the commands can use them without depending on the command line's
//! root (which depends on every command).

use std::path::PathBuf;

use clap::Args;

use crate::config::Config;
use crate::spec::SpecMethod;

/// Engine options shared by `serve` and `bench`; each overrides the config file.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Hugging Face model folder (default: the bundled demo model, models/demo-chat).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// TOML config file (see configs/brook.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// auto picks CUDA when a GPU is present, else CPU.
    #[arg(long, value_parser = ["auto", "cpu", "cuda"])]
    pub device: Option<String>,
    #[arg(long)]
    pub block_size: Option<usize>,
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// KV cache size for the CPU executor, in MiB.
    #[arg(long)]
    pub kv_cache_mib: Option<usize>,
    /// KV host tier in CPU memory, GiB (0 = none): evicted prefix blocks and swapped-out
    /// requests go there; pinned on CUDA.
    #[arg(long)]
    pub cpu_kv_cache_gib: Option<f64>,
    /// How preemption gives up a request's KV: auto (swap or recompute, whichever costs less),
    /// swap (whenever the host tier has room) or recompute.
    #[arg(long, value_enum)]
    pub preemption_mode: Option<crate::scheduler::swap::PreemptionMode>,
    /// Fraction of GPU memory for weights + KV (CUDA executor).
    #[arg(long)]
    pub gpu_memory_utilization: Option<f64>,
    /// KV cache element type: auto (the model's dtype, bf16 on CUDA), bf16, or fp8 (e4m3,
    /// per-tensor scale 1: half the bytes a token, twice the tokens in the pool). fp8 needs the
    /// CUDA executor on sm_89+; the CPU executor refuses it at start.
    #[arg(long, value_enum)]
    pub kv_cache_dtype: Option<crate::executor::cuda::KvCacheDtype>,
    /// Linear weights: none (the checkpoint's, as bf16) or fp8 (quantized at load to e4m3 with
    /// one scale per matrix; fp8 tensor-core GEMMs, half the weight bytes a decode step reads).
    /// CUDA executor on sm_89+ only; the CPU executor refuses it at start.
    #[arg(long, value_enum)]
    pub quantization: Option<crate::executor::cuda::Quantization>,
    /// CUDA executor: decode attention kernel, auto (tensor cores for grouped-query models and fp8
    /// KV caches, the CUDA-core lane kernel for MHA over bf16), lanes or mma (tensor cores, head
    /// dims up to 128).
    #[arg(long, value_enum)]
    pub decode_attention: Option<crate::executor::cuda::DecodeKernel>,
    /// CUDA executor: lookahead decode, off, on or auto (launched only while it pays; see
    /// `model.cuda_lookahead`). Auto by default.
    #[arg(long, value_enum)]
    pub cuda_lookahead: Option<crate::executor::cuda::LookaheadMode>,
    /// CPU executor threads (0 = all cores).
    #[arg(long)]
    pub cpu_threads: Option<usize>,
    /// Split the model over this many ranks (Megatron-style tensor parallelism: attention heads,
    /// MLP and vocabulary); each rank holds its KV heads in a pool of --kv-cache-mib. On the CPU
    /// the ranks are threads of this process; on CUDA one GPU a rank (collectives through host
    /// memory).
    #[arg(long)]
    pub tensor_parallel_size: Option<usize>,
    /// CUDA executor: longest context (tokens) whose prefill attention runs as cuBLAS GEMMs;
    /// longer ones use the flash kernel (0 = flash only).
    #[arg(long)]
    pub prefill_gemm_max_len: Option<usize>,
    /// CUDA executor: replay speculative verification steps from CUDA graphs (every sequence
    /// verifying the same number of drafts), as decode steps are. Off by default.
    #[arg(long)]
    pub cuda_verify_graphs: bool,
    /// CUDA executor: before serving, run a dummy prefill and a decode step at each batch-size
    /// bucket (cuBLAS's and the kernels' first use, the decode graphs), so the first requests do
    /// not pay them. On by default; `--cuda-warm-up false` turns it off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub cuda_warm_up: Option<bool>,
    /// Scheduling policy: fcfs, or adaptive (request classes, SLO-aware batch merging,
    /// emergency mode).
    #[arg(long, value_enum)]
    pub policy: Option<crate::scheduler::Policy>,
    /// Speculative decoding: off, ngram (prompt lookup, no extra model) or draft (a draft
    /// model, --draft-model). Default: draft when --draft-model is given, else the config's.
    #[arg(long, value_enum)]
    pub speculative: Option<SpecMethod>,
    /// Draft model folder for --speculative draft; its tokenizer must equal the target's.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Most draft tokens per request and step: the ceiling of the adaptive depth.
    #[arg(long)]
    pub spec_max_depth: Option<usize>,
    /// Always speculate at --spec-max-depth (within the KV-pressure and emergency rules)
    /// instead of choosing the depth by the cost model and acceptance.
    #[arg(long)]
    pub spec_fixed_depth: bool,
}

impl EngineArgs {
    /// The config file (or defaults) with these flags applied on top, validated.
    pub fn resolve(&self) -> anyhow::Result<Config> {
        let mut cfg = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(m) = &self.model {
            cfg.model.path = Some(m.clone());
        }
        if let Some(d) = &self.device {
            cfg.model.device = d.clone();
        }
        let set = |slot: &mut usize, v: Option<usize>| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        set(&mut cfg.cache.block_size, self.block_size);
        set(&mut cfg.scheduler.max_num_seqs, self.max_num_seqs);
        set(
            &mut cfg.scheduler.max_num_batched_tokens,
            self.max_num_batched_tokens,
        );
        set(&mut cfg.scheduler.max_model_len, self.max_model_len);
        set(&mut cfg.cache.kv_cache_mib, self.kv_cache_mib);
        set(&mut cfg.model.cpu_threads, self.cpu_threads);
        set(
            &mut cfg.model.tensor_parallel_size,
            self.tensor_parallel_size,
        );
        set(
            &mut cfg.model.prefill_gemm_max_len,
            self.prefill_gemm_max_len,
        );
        if self.cuda_verify_graphs {
            cfg.model.cuda_verify_graphs = true;
        }
        if let Some(on) = self.cuda_warm_up {
            cfg.model.cuda_warm_up = on;
        }
        if let Some(p) = self.policy {
            cfg.scheduler.policy = p;
        }
        if let Some(g) = self.cpu_kv_cache_gib {
            cfg.cache.cpu_kv_cache_gib = g;
        }
        if let Some(m) = self.preemption_mode {
            cfg.scheduler.preemption_mode = m;
        }
        if let Some(u) = self.gpu_memory_utilization {
            cfg.cache.gpu_memory_utilization = u;
        }
        if let Some(d) = self.kv_cache_dtype {
            cfg.cache.kv_cache_dtype = d;
        }
        if let Some(q) = self.quantization {
            cfg.model.quantization = q;
        }
        if let Some(m) = self.cuda_lookahead {
            cfg.model.cuda_lookahead = m;
        }
        if let Some(k) = self.decode_attention {
            cfg.model.decode_attention = k;
        }
        let spec = &mut cfg.speculative;
        if let Some(d) = &self.draft_model {
            spec.draft_model = Some(d.clone());
            spec.method = SpecMethod::Draft;
        }
        if let Some(m) = self.speculative {
            spec.method = m;
        }
        set(&mut spec.max_depth, self.spec_max_depth);
        if self.spec_fixed_depth {
            spec.adaptive = false;
        }
        // Flags that would be ignored are mistakes to say, not to skip.
        if let (Some(_), Some(m)) = (&self.draft_model, self.speculative) {
            anyhow::ensure!(
                m == SpecMethod::Draft,
                "--draft-model goes with --speculative draft, not {}",
                m.as_str()
            );
        }
        if spec.method == SpecMethod::Off
            && (self.spec_fixed_depth || self.spec_max_depth.is_some())
        {
            anyhow::bail!(
                "--spec-max-depth and --spec-fixed-depth need speculative decoding \
                 (--speculative ngram|draft, or --draft-model)"
            );
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: super::EngineArgs,
    }

    fn resolve(args: &[&str]) -> anyhow::Result<crate::config::Config> {
        Cli::parse_from(std::iter::once("brook").chain(args.iter().copied()))
            .engine
            .resolve()
    }

    /// Speculative flags that would do nothing are refused, saying which go together.
    #[test]
    fn speculative_flags_that_would_be_ignored_are_refused() {
        let e = resolve(&["--draft-model", "d", "--speculative", "ngram"]).unwrap_err();
        assert!(e.to_string().contains("--speculative draft"), "{e}");
        for flags in [&["--spec-fixed-depth"][..], &["--spec-max-depth", "3"]] {
            let e = resolve(flags).unwrap_err();
            assert!(e.to_string().contains("need speculative decoding"), "{e}");
        }
        assert!(resolve(&["--speculative", "ngram", "--spec-max-depth", "3"]).is_ok());
        assert!(resolve(&["--draft-model", "d", "--spec-fixed-depth"]).is_ok());
    }

    /// `--tensor-parallel-size` reaches the config and the CPU options; 0 is refused.
    #[test]
    fn tensor_parallel_size_flows_to_the_cpu_options() {
        use crate::executor::cpu::CpuBackendOptions;
        let cfg = resolve(&["--tensor-parallel-size", "2"]).unwrap();
        assert_eq!(cfg.model.tensor_parallel_size, 2);
        assert_eq!(
            CpuBackendOptions::from_config(&cfg, false).tensor_parallel_size,
            2
        );
        assert_eq!(resolve(&[]).unwrap().model.tensor_parallel_size, 1);
        let e = resolve(&["--tensor-parallel-size", "0"]).unwrap_err();
        assert!(e.to_string().contains("tensor_parallel_size"), "{e}");
    }
}
