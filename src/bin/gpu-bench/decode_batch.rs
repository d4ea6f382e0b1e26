//! `gpu-bench decode-batch`: one large decode batch at a long context, step by step, without
//! prefilling it: what a step of `offline`'s steady state costs, and with `--breakdown` what each
//! kind of launch costs inside it (the default with that kind left out).
//!
//! Each sequence enters as a prefix-cache hit of `context - 1` tokens on blocks of its own (the
//! cache holds whatever the pool held: the attention reads every byte all the same), so a
//! batch of 1000 at 1,500 tokens is ready in one step instead of a minute of prefill.

use std::sync::Arc;
use std::time::Instant;

use brook::executor::backend::Backend;
use brook::executor::cuda::{skip, CudaBackend, CudaBackendOptions, KvCacheDtype};
use brook::sampling::params::SamplingParams;
use serde_json::json;

use crate::common::{
    backend, bench_options, elapsed_ms, emit, report_trace, PrefixHitBatch, StepTimes, SKIPS,
};

/// Leave-one-out sets on top of `SKIPS`: the LM head (with the final norm) and sampling, which
/// at a 128k vocabulary and batch 1000 are no longer small.
const HEAD_SKIPS: [(&str, u32); 2] = [("lm head", skip::HEAD), ("sample", skip::SAMPLE)];

pub struct Args<'a> {
    pub model: &'a str,
    pub batch: usize,
    pub context: usize,
    pub steps: usize,
    pub breakdown: bool,
    /// Time each launch of the last step (`Gpu::start_trace`; CUDA graphs off, as its
    /// launches must be the stream's own).
    pub trace: bool,
    pub dtypes: &'a [KvCacheDtype],
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.steps >= 3 + usize::from(a.trace) && a.context >= 1 && a.batch >= 1,
        "decode-batch needs at least 3 steps (4 with --trace), a context and a batch"
    );
    for &dtype in a.dtypes {
        let base = CudaBackendOptions {
            max_num_seqs: a.batch,
            max_num_batched_tokens: a.batch.max(8192),
            kv_cache_dtype: dtype,
            step_timing: true,
            cuda_graphs: !a.trace,
            ..bench_options()
        };
        let variants = std::iter::once(("", 0))
            .chain(SKIPS.into_iter().chain(HEAD_SKIPS).filter(|_| a.breakdown));
        for (skipped, bits) in variants {
            let b = backend(
                a.model,
                CudaBackendOptions {
                    skip: bits,
                    ..base.clone()
                },
            )?;
            run_one(a, b, dtype, skipped)?;
        }
    }
    Ok(())
}

fn run_one(a: &Args, mut b: CudaBackend, dtype: KvCacheDtype, skipped: &str) -> anyhow::Result<()> {
    let bs = b.info().block_size;
    let per_seq = (a.context + a.steps).div_ceil(bs);
    anyhow::ensure!(
        a.batch * per_seq <= b.info().num_kv_blocks,
        "{} sequences of {} blocks need more than the pool's {} blocks",
        a.batch,
        per_seq,
        b.info().num_kv_blocks
    );
    let vocab = b.config().vocab_size as u32;
    let params = Arc::new(SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(a.steps + 1)
    });
    let seqs = PrefixHitBatch {
        first_id: 0,
        batch: a.batch,
        context: a.context,
        per_seq,
        vocab,
        params,
    };
    let mut times = StepTimes::default();
    let traced = a.trace && skipped.is_empty();
    let mut trace = Vec::new();
    for i in 0..a.steps {
        let out = seqs.step(i);
        // The traced step (the last) stays out of the medians.
        if traced && i + 1 == a.steps {
            b.gpu().start_trace()?;
            b.execute(&out)?;
            trace = b.gpu().take_trace()?;
            continue;
        }
        let t0 = Instant::now();
        b.execute(&out)?;
        times.push(&b, elapsed_ms(t0));
    }
    // The first steps carry the requests' state and warm the allocator and cuBLAS.
    let (wall, gpu, host) = times.medians(2);
    let kv = dtype.as_str();
    eprintln!(
        "{} decode batch {} at context {}, kv {kv}, skipped [{skipped}]: {wall:.2} ms a step (GPU span {gpu:.2?} ms; host prepare / launch / wait {host:.2?} ms)",
        a.model, a.batch, a.context
    );
    emit(json!({
        "figure": "decode_batch_step_ms", "model": a.model, "kv_cache_dtype": kv, "batch": a.batch,
        "context": a.context, "steps": a.steps, "median_ms": wall, "gpu_span_ms": gpu,
        "host_prepare_launch_wait_ms": host, "skipped": skipped,
    }));
    if traced {
        let label = format!(
            "{} decode batch {} ctx {} kv {kv}",
            a.model, a.batch, a.context
        );
        report_trace(&label, &trace, gpu);
    }
    Ok(())
}
