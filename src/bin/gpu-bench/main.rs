//! `gpu-bench`: measurements of the CUDA executor on synthetic (random, GPU-generated) weights.
//!
//!   gpu-bench attention                 paged decode attention GB/s (ctx x batch), prefill TFLOP/s
//!                                       (decode: lone, 8 back to back, queued behind a spin;
//!                                       a memcpy of the same bytes beside each case)
//!
//! Every backend is made with the linear weights `BROOK_QUANTIZATION` names (none, the default,
//! or fp8: e4m3 weights, `--quantization fp8`); every figure carries it as `quantization`.
//!
//! `BROOK_BLOCK_SIZE` (8, 16, 32 or 64; 16 when unset, brook's default) sets the tokens a KV block
//! holds in every backend and attention case.
//!
//! attention, decode, ttft and offline take `--kv-cache-dtype bf16,fp8` (comma-separated: each
//! dtype in turn in one process, each figure tagged with its `kv_cache_dtype`) for A/B runs.
//!
//!   gpu-bench prefill-attn              prefill attention, GEMM path vs flash kernel by length
//!   gpu-bench prefill-chunks            flash prefill attention of one chunk (64-2048 queries) at
//!                                       the end of a 2k/8k/16k context: split over the keys vs not
//!   gpu-bench decode  --model NAME      batch-1 decode ms/token (CUDA graphs on and off)
//!   gpu-bench decode-batch              one decode batch (e.g. 1000) at a long context, no
//!                                       prefill: ms a step, GPU span, host time; --breakdown
//!                                       leaves each kind of launch out in turn, --trace times
//!                                       each launch of the last step in place
//!   gpu-bench ttft    --model NAME      one prompt of --input-len tokens: time to first token
//!                                       (--trace: each launch's time in place; --gap-ms: idle
//!                                       before each run)
//!   gpu-bench cold                      a fresh backend's first prefills and first decode steps
//!                                       at each batch size (graph capture) against warm ones
//!   gpu-bench offline --model NAME      N requests x input/output tokens through brook's scheduler
//!                                       (--variants: once per set of issue-18 switches, each
//!                                       in its own process)
//!   gpu-bench decode-variants           decode through the scheduler for the default and each
//!                                       issue-18 switch, each in its own process: ms/step, GPU
//!                                       idle gap between steps (host overhead), lookahead hits
//!   gpu-bench overlap                   a large decode batch's GEMMs and attention as two
//!                                       nano-batches on two streams vs the whole batch on one
//!   gpu-bench elementwise               add_rmsnorm and silu_mul alone (GB/s against copy) and
//!                                       the gate|up GEMM over random input vs zeros
//!   gpu-bench gemm-algos                a prefill's linear layers: cuBLAS's kernel choice against
//!                                       each candidate of cuBLASLt's heuristic
//!   gpu-bench swap    --model NAME      KV block copies device <-> pinned host tier vs the copy
//!                                       ceiling (one contiguous pinned copy)
//!   gpu-bench spec                      speculative decoding (issue 12): the cost of verifying k
//!                                       drafts vs plain decode at batch 1/8/32 (k 0..5), and
//!                                       single-stream tokens/s with a random draft model whose
//!                                       acceptance is controlled (a 0.5/0.7/0.9, k 1..5) vs off;
//!                                       --variants picks (a)'s, --verify-graphs A/Bs (b) eager vs
//!                                       verification graphs
//!   gpu-bench stream-floor --model M    one token's linear weights streamed at batch 1: the bulk
//!                                       gemv's ring alone and the shipped gemv, in one launch
//!                                       and one launch a matrix (PDL or not); a device copy
//!   gpu-bench gemv-sweep                batch-1 GEMV GB/s on the synthetic models' layers: brook's
//!                                       gemv by split and (warps, loads in flight) build, cuBLAS
//!
//! Each prints one JSON object per figure on stdout (`{"figure": ..., ...}`), progress on stderr.
//! The offline run drives brook's own `Scheduler` and `KvCacheManager` step by step (no actors,
//! no tokenizer), so it measures the executor and the scheduler together.
//!
//! One module per benchmark; `common` holds the timing, JSON output, buffer and backend helpers
//! they share.

mod attention;
mod boundary_stamps;
mod cold;
mod common;
mod decode;
mod decode_batch;
mod elementwise;
mod gemm_algos;
mod gemv_sweep;
mod green;
mod isolate;
mod offline;
mod overlap;
mod prefill_attn;
mod prefill_chunks;
mod spec;
mod spin;
mod stream_floor;
mod swap;
mod ttft;
mod variants;

use brook::executor::cuda::KvCacheDtype;
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Attention {
        /// Paged decode attention only (every split rule and merge), not the prefill kernel.
        #[arg(long)]
        decode_only: bool,
        /// KV cache dtypes to run in turn (comma-separated), e.g. bf16,fp8.
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [KvCacheDtype::Auto])]
        kv_cache_dtype: Vec<KvCacheDtype>,
        /// Head shapes, each heads/kv_heads/head_dim (comma-separated); default: Llama-2-7B,
        /// Llama-3-8B, Qwen2.5-7B and Phi-3-mini.
        #[arg(long, value_delimiter = ',', default_values_t = attention::default_shapes())]
        shapes: Vec<String>,
        /// Only these decode variants (comma-separated names; default: all), e.g. for a profiler;
        /// "serving" is the backend's own split rule, merge and kernel at each case.
        #[arg(long, value_delimiter = ',')]
        variants: Vec<String>,
        /// Decode cases, each ctx/batch, any shape (comma-separated; default: 1k/4k/16k keys by
        /// batch 1/16/64/256).
        #[arg(long, value_delimiter = ',')]
        cases: Vec<String>,
    },
    GemvSweep,
    /// One token's linear weights streamed at batch 1, in one launch and in one a matrix: the
    /// floor a persistent decode path could reach.
    StreamFloor {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
    },
    /// One layer's prefill attention (no cached prefix) on both paths, by prompt length, at
    /// batch 1, 8 and 32; then the length from which the flash kernel wins.
    PrefillAttn {
        /// Head shapes of these synthetic models (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [String::from("llama-2-7b"), String::from("llama-3-8b")])]
        model: Vec<String>,
    },
    /// One layer's flash prefill attention for a chunk of 64-2048 queries at the end of a
    /// 2k/8k/16k context: unsplit, split as the backend chooses, and at forced split counts.
    PrefillChunks {
        /// Head shapes of these synthetic models (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [String::from("llama-2-7b")])]
        model: Vec<String>,
    },
    Decode {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        #[arg(long, default_value_t = 128)]
        input_len: usize,
        #[arg(long, default_value_t = 256)]
        output_len: usize,
        /// brook's defaults only (no variants): for a profiler run.
        #[arg(long)]
        quick: bool,
        /// KV cache dtypes to run in turn (comma-separated), e.g. bf16,fp8, each in its own
        /// process (see `isolate`).
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [KvCacheDtype::Auto])]
        kv_cache_dtype: Vec<KvCacheDtype>,
    },
    /// One decode batch at a long context (prefix-cache hits, no prefill), step by step.
    DecodeBatch {
        #[arg(long, default_value = "llama-3-8b")]
        model: String,
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// Tokens of context each sequence decodes at.
        #[arg(long, default_value_t = 1500)]
        context: usize,
        #[arg(long, default_value_t = 12)]
        steps: usize,
        /// Also time the step with each kind of launch left out (norms, RoPE, attention, SiLU,
        /// the linear layers, the LM head, sampling).
        #[arg(long)]
        breakdown: bool,
        /// Also time each launch of the last step (events between launches, CUDA graphs off),
        /// summed by kernel.
        #[arg(long)]
        trace: bool,
        /// KV cache dtypes to run in turn (comma-separated), e.g. bf16,fp8, each in its own
        /// process (see `isolate`).
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [KvCacheDtype::Auto])]
        kv_cache_dtype: Vec<KvCacheDtype>,
    },
    /// A large decode batch's layers as two nano-batches on two streams (GEMMs beside
    /// attention) against the whole batch on one stream (GEMMs, attention, no element-wise).
    Overlap {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        /// Whole batches (comma-separated), each cut in two halves.
        #[arg(long, value_delimiter = ',', default_values_t = [256, 512])]
        batch: Vec<usize>,
        /// Keys every sequence attends to (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [192, 1024])]
        context: Vec<usize>,
        /// Layers a timed run goes through (default: the model's).
        #[arg(long)]
        layers: Option<usize>,
        /// Timed runs a variant (after 2 untimed).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// SM counts (comma-separated) to hold cuBLAS's GEMMs to, each adding `gemms_only_smX`
        /// and `two_streams_smX`.
        #[arg(long, value_delimiter = ',')]
        sm_targets: Vec<usize>,
        /// SM counts (comma-separated) of a green-context partition for the GEMMs, the rest
        /// for attention, each adding `gemms_only_greenX`, `attention_only_greenX` and
        /// `two_streams_greenX`.
        #[arg(long, value_delimiter = ',')]
        green: Vec<usize>,
    },
    /// A step's element-wise kernels alone against the copy bandwidth, and the gate|up GEMM
    /// over random input against zeros (what `--breakdown`'s leave-one-out rows can owe to it).
    Elementwise {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        /// Token counts (comma-separated): rows of each run.
        #[arg(long, value_delimiter = ',', default_values_t = [512, 2048])]
        tokens: Vec<usize>,
        /// Rounds a figure is the median of.
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// A prefill's linear layers on cuBLAS's own kernel choice against each algorithm cuBLASLt's
    /// heuristic offers for the same GEMM.
    GemmAlgos {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        /// Token counts (comma-separated): rows of each GEMM.
        #[arg(long, value_delimiter = ',', default_values_t = [512, 2048])]
        tokens: Vec<usize>,
        /// Most candidates asked of the heuristic a shape.
        #[arg(long, default_value_t = 12)]
        algos: usize,
    },
    Swap {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        /// Host tier size, GiB (pinned).
        #[arg(long, default_value_t = 8.0)]
        host_gib: f64,
    },
    /// A fresh backend's first steps against the same steps warm: the first prefills, and the
    /// first decode steps at each batch size (CUDA graph captured on first use).
    Cold {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        #[arg(long, default_value_t = 2048)]
        input_len: usize,
        /// Decode batch sizes, in the order visited (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8, 16, 32, 64, 128, 256])]
        batches: Vec<usize>,
        #[arg(long, default_value_t = 128)]
        context: usize,
        /// The backend warms up at start (`--cuda-warm-up`).
        #[arg(long)]
        warm_up: bool,
    },
    Ttft {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        #[arg(long, default_value_t = 2048)]
        input_len: usize,
        /// Also time the step with each kind of launch left out (norms, RoPE, attention, SiLU,
        /// the linear layers): what each costs inside the prefill.
        #[arg(long)]
        breakdown: bool,
        /// Also time each launch of one more run (events between launches), summed by kernel.
        #[arg(long)]
        trace: bool,
        /// Idle ms before each run (0: back to back), so each starts on an idle GPU.
        #[arg(long, default_value_t = 0)]
        gap_ms: u64,
        /// KV cache dtypes to run in turn (comma-separated), e.g. bf16,fp8, each in its own
        /// process (see `isolate`).
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [KvCacheDtype::Auto])]
        kv_cache_dtype: Vec<KvCacheDtype>,
    },
    Offline {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        #[arg(long, default_value_t = 512)]
        num_prompts: usize,
        #[arg(long, default_value_t = 128)]
        input_len: usize,
        #[arg(long, default_value_t = 128)]
        output_len: usize,
        #[arg(long, default_value_t = 512)]
        max_num_seqs: usize,
        #[arg(long, default_value_t = 8192)]
        max_num_batched_tokens: usize,
        #[arg(long)]
        no_cuda_graphs: bool,
        /// Issue-18 switch sets to run in turn (`decode-variants` names), e.g. default,all.
        #[arg(long, value_delimiter = ',', default_values_t = [String::from("untimed")])]
        variants: Vec<String>,
        /// KV cache dtypes to run in turn (comma-separated), e.g. bf16,fp8: each variant once
        /// per dtype, each in its own process (see `isolate`).
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [KvCacheDtype::Auto])]
        kv_cache_dtype: Vec<KvCacheDtype>,
    },
    /// Speculative decoding: verification cost by batch and depth, and single-stream speedup
    /// at a forced acceptance rate (see `spec`'s module docs).
    Spec(spec::Args),
    /// Decode through brook's scheduler and persistent batch for the default and each issue-18
    /// switch, each in its own process: ms/step, the GPU's idle gap between steps, lookahead hits.
    DecodeVariants {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        /// Prompt lengths (comma-separated): the context each decode runs at.
        #[arg(long, value_delimiter = ',', default_values_t = [128usize, 8192])]
        input_len: Vec<usize>,
        #[arg(long, default_value_t = 256)]
        output_len: usize,
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Which variants (comma-separated); default: all of them.
        #[arg(long, value_delimiter = ',', default_values = variants::VARIANTS)]
        variants: Vec<String>,
        /// Run every variant in this process, one backend after another (each in its own
        /// process otherwise): the order effect of session 31. Prints the device memory pool's
        /// reserved and used bytes after each backend is dropped.
        #[arg(long)]
        same_process: bool,
        /// With --same-process: release the memory pool's unused bytes after each backend is
        /// dropped (`cuMemPoolTrimTo`), before the next one is built.
        #[arg(long, requires = "same_process")]
        trim_pool: bool,
    },
}

fn main() -> anyhow::Result<()> {
    brook::logging::init();
    let cmd = Cli::parse().cmd;
    if let Some((flag, values)) = cmd.split_flag() {
        if isolate::each_in_own_process(flag, &values)? {
            return Ok(());
        }
    }
    match cmd {
        Cmd::Attention {
            decode_only,
            kv_cache_dtype,
            shapes,
            variants,
            cases,
        } => attention::run(
            decode_only,
            &kv_cache_dtype,
            &shapes,
            &attention::DecodeFilter::parse(&variants, &cases)?,
        ),
        Cmd::GemvSweep => gemv_sweep::run(),
        Cmd::StreamFloor { model } => stream_floor::run(&model),
        Cmd::PrefillAttn { model } => prefill_attn::run(&model),
        Cmd::PrefillChunks { model } => prefill_chunks::run(&model),
        Cmd::Decode {
            model,
            input_len,
            output_len,
            quick,
            kv_cache_dtype,
        } => decode::run(&model, input_len, output_len, quick, &kv_cache_dtype),
        Cmd::Cold {
            model,
            input_len,
            batches,
            context,
            warm_up,
        } => cold::run(&cold::Args {
            model: &model,
            input_len,
            batches: &batches,
            context,
            warm_up,
        }),
        Cmd::Ttft {
            model,
            input_len,
            breakdown,
            trace,
            gap_ms,
            kv_cache_dtype,
        } => ttft::run(&ttft::Args {
            model: &model,
            input_len,
            breakdown,
            trace,
            gap_ms,
            dtypes: &kv_cache_dtype,
        }),
        Cmd::DecodeBatch {
            model,
            batch,
            context,
            steps,
            breakdown,
            trace,
            kv_cache_dtype,
        } => decode_batch::run(&decode_batch::Args {
            model: &model,
            batch,
            context,
            steps,
            breakdown,
            trace,
            dtypes: &kv_cache_dtype,
        }),
        Cmd::Overlap {
            model,
            batch,
            context,
            layers,
            reps,
            sm_targets,
            green,
        } => overlap::run(&overlap::Args {
            model: &model,
            batch: &batch,
            context: &context,
            layers,
            reps,
            sm_targets: &sm_targets,
            green: &green,
        }),
        Cmd::Elementwise {
            model,
            tokens,
            reps,
        } => elementwise::run(&elementwise::Args {
            model: &model,
            tokens: &tokens,
            reps,
        }),
        Cmd::GemmAlgos {
            model,
            tokens,
            algos,
        } => gemm_algos::run(&gemm_algos::Args {
            model: &model,
            tokens: &tokens,
            algos,
        }),
        Cmd::Swap { model, host_gib } => swap::run(&model, host_gib),
        Cmd::Spec(args) => spec::run(&args),
        Cmd::Offline {
            model,
            num_prompts,
            input_len,
            output_len,
            max_num_seqs,
            max_num_batched_tokens,
            no_cuda_graphs,
            variants,
            kv_cache_dtype,
        } => offline::run(
            &model,
            num_prompts,
            input_len,
            output_len,
            max_num_seqs,
            max_num_batched_tokens,
            !no_cuda_graphs,
            &variants,
            &kv_cache_dtype,
        ),
        Cmd::DecodeVariants {
            model,
            input_len,
            output_len,
            batch,
            variants,
            same_process,
            trim_pool,
        } => {
            let pool = same_process.then_some(variants::PoolCheck { trim: trim_pool });
            variants::run(&model, &input_len, output_len, batch, &variants, pool)
        }
    }
}

impl Cmd {
    /// The list flag whose values each run in their own process (see `isolate`), with its
    /// values: `--variants` before `--kv-cache-dtype` (a child with one variant splits again by
    /// dtype). None for the commands that build their backends otherwise.
    fn split_flag(&self) -> Option<(&'static str, Vec<&str>)> {
        let dtypes = |v: &[KvCacheDtype]| v.iter().map(|d| d.as_str()).collect();
        match self {
            Cmd::DecodeVariants {
                variants,
                same_process: false,
                ..
            } => Some(("--variants", variants.iter().map(String::as_str).collect())),
            Cmd::Offline { variants, .. } if variants.len() > 1 => {
                Some(("--variants", variants.iter().map(String::as_str).collect()))
            }
            Cmd::Offline { kv_cache_dtype, .. }
            | Cmd::Decode { kv_cache_dtype, .. }
            | Cmd::DecodeBatch { kv_cache_dtype, .. }
            | Cmd::Ttft { kv_cache_dtype, .. } => {
                Some(("--kv-cache-dtype", dtypes(kv_cache_dtype)))
            }
            _ => None,
        }
    }
}
