//! The CUDA executor: brook's own kernels (`kernels/*.cu`, compiled with NVRTC at start) and
//! cuBLAS GEMMs behind the same `Backend` trait as the CPU executor.
//!
//! - `device`: context, stream, cuBLAS handle, kernel loading, raw buffers, the GPU probe
//! - `compile`: NVRTC with an on-disk PTX cache keyed by source hash and architecture
//! - `kernels`: parameter structs mirrored from the .cu files, and their launches
//! - `gemm`: linear layers (bf16, or e4m3 weights: `gemv_fp8` for decode rows, else
//!   `fp8_gemm`) with fp32 accumulation, strided-batched GEMMs
//! - `fp8_gemm`: fp8 tensor-core GEMMs through cuBLASLt for `--quantization fp8`
//! - `prefill_gemm`: prefill attention for short contexts through cuBLAS (the flash kernel
//!   takes the long ones)
//! - `weights`: weights on the GPU (uploaded, or random for synthetic benchmarks), bf16 or
//!   the linear layers quantized to e4m3 at load
//! - `options`: `CudaBackendOptions`
//! - `backend`: `CudaBackend`: the persistent input batch, steps in, sampled tokens out
//! - `forward`: weights, activations, KV pool and device block tables; one step's launches,
//!   CUDA graphs for decode
//! - `kv_tier`: the KV host tier in pinned memory, block copies on a copy stream with events
//! - `step_meta`: one step's integer metadata, packed on the host (tested on the CPU)
//! - `speculation`: the proposer and the verification of a step's drafts
//! - `draft`: the draft model's forward (speculative decoding), a second `Forward` on the device
//! - `tp`, `collective`: tensor parallelism, a world of `CudaBackend` ranks over shards of
//!   the model meeting in host-staged collectives
//! - `lookahead`: which step to launch before the scheduler asks for it, and whether the plan
//!   that arrives is that step (tested on the CPU)
pub mod backend;
mod collective;
pub mod compile;
pub mod device;
mod draft;
mod forward;
pub mod fp8_gemm;
pub mod gemm;
pub mod kernels;
pub mod kv_tier;
pub mod lookahead;
pub mod lt_desc;
pub mod options;
pub mod prefill_gemm;
mod speculation;
mod step_meta;
pub mod tp;
pub mod weights;

pub use backend::{
    pdl_small, skip, CudaBackend, CudaBackendOptions, LookaheadStats, StepTiming, WarmUp,
};
pub use device::{probe, Gpu};
pub use forward::{decode_fill, decode_split_rule};
pub use options::{DecodeKernel, GemvSmem, KvCacheDtype, LookaheadMode, Quantization};
pub use tp::CudaTpBackend;
