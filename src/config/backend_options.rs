//! The backends' options built from the engine config: the config is the one source of their
//! defaults. Here rather than in `executor`, so the executor does not depend on the config
//! (which holds the scheduler's config; the scheduler drives the executor).

use super::Config;
use crate::executor::cpu::CpuBackendOptions;
use crate::executor::cuda::compile::PREFILL_WG_STAGES;
use crate::executor::cuda::kernels::GEMV_MAX_M;
use crate::executor::cuda::{lookahead, pdl_small, CudaBackendOptions, GemvSmem, LookaheadMode};

impl CpuBackendOptions {
    /// The options `brook serve` runs with, from the engine config (the one source of their
    /// defaults).
    pub fn from_config(cfg: &Config, progress: bool) -> Self {
        CpuBackendOptions {
            block_size: cfg.cache.block_size,
            kv_cache_bytes: cfg.cache.kv_cache_mib << 20,
            num_threads: (cfg.model.cpu_threads > 0).then_some(cfg.model.cpu_threads),
            progress,
            host_kv_cache_bytes: cfg.cache.cpu_kv_cache_bytes(),
            copy_bytes_per_s: (cfg.cache.swap_bandwidth_gbs > 0.0)
                .then_some(cfg.cache.swap_bandwidth_gbs * 1e9),
            tensor_parallel_size: cfg.model.tensor_parallel_size,
        }
    }
}

/// The default config's options.
impl Default for CpuBackendOptions {
    fn default() -> Self {
        Self::from_config(&Config::default(), true)
    }
}

impl CudaBackendOptions {
    /// The options `brook serve` runs with: the shared knobs from the engine config (the one
    /// source of their defaults), the CUDA-only ones at their defaults here.
    pub fn from_config(cfg: &Config, progress: bool) -> Self {
        CudaBackendOptions {
            device_ordinal: 0,
            block_size: cfg.cache.block_size,
            gpu_memory_utilization: cfg.cache.gpu_memory_utilization,
            max_kv_cache_bytes: None,
            max_num_batched_tokens: cfg.scheduler.max_num_batched_tokens,
            max_num_seqs: cfg.scheduler.max_num_seqs,
            max_model_len: cfg.scheduler.max_model_len,
            cuda_graphs: true,
            verify_graphs: cfg.model.cuda_verify_graphs,
            warm_up: cfg.model.cuda_warm_up,
            gemv_max_rows: GEMV_MAX_M,
            gemv_split: 0,
            gemv_bulk: true,
            // Measured on an H100 (BENCHMARKS issue 18): tight against roomy, batch 2-4 at 4k
            // 0.5-1.0 % faster (session 39); deep against tight, batch 1 0.6-1.7 % faster
            // (session 41).
            gemv_smem: GemvSmem::Deep,
            fuse_decode: false,
            pdl: true,
            // Measured (session 37, BENCHMARKS issue 18): SiLU with PDL takes 1.3-1.6 % off
            // batch-1 decode on an H100 (0.4 % slower on the H200); RoPE with it lost 5-8 % at
            // batch 2 and 4; the sampler's tied.
            pdl_small: pdl_small::SILU,
            prefill_gemm_max_len: cfg.model.prefill_gemm_max_len,
            pinned_io: false,
            lookahead: cfg.model.cuda_lookahead != LookaheadMode::Off,
            lookahead_gate_us: (cfg.model.cuda_lookahead == LookaheadMode::Auto)
                .then_some(lookahead::DEFAULT_GAIN_US),
            // Measured on the H200 (call c, BENCHMARKS issue 18): batch 1 at ctx 4k/16k from
            // 29/39 % to 40/66 % of copy bandwidth, batch 16 from 65/68 % to 80/85 %, batch 64
            // unchanged.
            decode_ctas_per_sm: 8,
            decode_merge_inline: true,
            // Measured on an H100 and the H200 (session 35, BENCHMARKS issue 18): batch-1 decode
            // 0.2-1.4 % faster (Llama-2-7B, Llama-3-8B, 128 to 7.9k tokens); taken only where the
            // grid fills at most half a wave (`Limits::decode_splits`).
            decode_cluster: true,
            decode_min_split_keys: 0,
            decode_defines: Vec::new(),
            decode_kernel: cfg.model.decode_attention,
            prefill_wgmma: true,
            prefill_wg_stages: PREFILL_WG_STAGES,
            // Measured on the H200 (session 20, BENCHMARKS issue 18): prefill attention 15-20 %
            // faster for long chunks, TTFT of 8,000 tokens (Llama-3-8B) 236 -> 226 ms.
            prefill_tma: true,
            // Measured on the H200 (session 29, BENCHMARKS issue 18): TTFT at 2048 tokens 42.5-42.8
            // -> 41.4-41.7 ms rested; the demo model's greedy tokens still match the CPU's.
            gate_up_bf16: true,
            prefill_split_kv: true,
            // Measured on an H100 (session 27, BENCHMARKS issue 18): a batch-512 decode step
            // 0.8 % faster, TTFT at 2048 tokens unchanged.
            residual_gemm: true,
            step_timing: false,
            progress,
            host_kv_cache_bytes: cfg.cache.cpu_kv_cache_bytes(),
            sample_vocab_size: 0,
            max_drafts: match cfg.speculative.enabled() {
                true => cfg.speculative.max_depth,
                false => 0,
            },
            skip: 0,
            kv_cache_dtype: cfg.cache.kv_cache_dtype,
            quantization: cfg.model.quantization,
        }
    }
}

impl Default for CudaBackendOptions {
    fn default() -> Self {
        Self::from_config(&Config::default(), true)
    }
}
