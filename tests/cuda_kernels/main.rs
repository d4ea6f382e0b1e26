//! Every CUDA kernel against a CPU reference on random inputs (odd sizes, random block tables,
//! outputs poisoned before the run), llm.c `dev/cuda` style: one file per op, the shared parts in
//! `harness` (device or skip, random inputs, poisoned buffers, relative and max-abs error
//! checks), `paged` (the paged KV cache, attention reference, prefill fixture) and `qkv_write`
//! (the RoPE + K/V write checker); `checkers` tests those checkers on the CPU. Without a GPU each
//! kernel test says so and returns, so CPU CI stays green; with `BROOK_REQUIRE_GPU=1`
//! (scripts/gpu-check.sh) a missing GPU fails instead.

mod checkers;
mod harness;
mod paged;
mod qkv_write;

mod causal_softmax;
mod embedding;
mod fill;
mod fp8_weights;
mod gemm;
mod gemm_prefill;
mod gemv;
mod gemv_chain;
mod kv_gather;
mod kv_stage;
mod paged_decode;
mod prefill_attn;
mod rmsnorm;
mod rope_kv;
mod sample;
mod sample_penalties;
mod silu_mul;
mod step_io;
mod trace;
