//! `gpu-bench ttft`: one prompt in one step (prefill + first token); with `--breakdown`, also the
//! default with each kind of launch left out (what each costs inside the prefill step).

use std::time::Instant;

use brook::executor::backend::Backend;
use brook::executor::cuda::{CudaBackendOptions, KvCacheDtype};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{
    backend, bench_options, elapsed_ms, emit, fresh_prompt_step, report_trace, StepTimes, SKIPS,
};

pub struct Args<'a> {
    pub model: &'a str,
    pub input_len: usize,
    /// Also each of `SKIPS` left out.
    pub breakdown: bool,
    /// Also one more run with each launch timed (`Gpu::start_trace`).
    pub trace: bool,
    /// Idle ms before each run (0: back to back): each prefill then starts on an idle GPU, as
    /// a lone request arriving at an idle server does, rather than on one still hot and at its
    /// power limit from the run before.
    pub gap_ms: u64,
    pub dtypes: &'a [KvCacheDtype],
}

/// One prompt in one step (prefill + first token), median of 5 on fresh blocks; then, with
/// `breakdown`, the same with each of `SKIPS` left out; all once per KV cache dtype.
pub fn run(a: &Args) -> anyhow::Result<()> {
    for &dtype in a.dtypes {
        run_dtype(a, dtype)?;
    }
    Ok(())
}

/// `run` for one KV cache dtype.
fn run_dtype(a: &Args, dtype: KvCacheDtype) -> anyhow::Result<()> {
    let (model, input_len, breakdown) = (a.model, a.input_len, a.breakdown);
    // Step stamps on: the GPU's span of the step (first kernel's start to last kernel's end)
    // against the wall time says how much of a TTFT is the host's (two one-thread stamp
    // kernels, a few µs).
    let base = CudaBackendOptions {
        max_num_seqs: 8,
        max_num_batched_tokens: input_len,
        kv_cache_dtype: dtype,
        step_timing: true,
        ..bench_options()
    };
    let kv = dtype.as_str();
    let variants = std::iter::once(("", 0)).chain(SKIPS.into_iter().filter(|_| breakdown));
    for (skipped, bits) in variants {
        let mut b = backend(
            model,
            CudaBackendOptions {
                skip: bits,
                ..base.clone()
            },
        )?;
        let bs = b.info().block_size;
        let vocab = b.config().vocab_size as u32;
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut times = StepTimes::default();
        // The traced run (without leave-outs) comes last and stays out of the medians.
        let traced = a.trace && bits == 0;
        for rep in 0..6 + usize::from(traced) {
            let step = fresh_prompt_step(rep, input_len, bs, vocab, &mut rng);
            // A benchmark's pause between runs, not the engine's loop.
            std::thread::sleep(std::time::Duration::from_millis(a.gap_ms));
            if rep == 6 {
                b.gpu().start_trace()?;
                b.execute(&step)?;
                let trace = b.gpu().take_trace()?;
                let span = times.medians(1).1;
                report_trace(&format!("{model} ttft {input_len} kv {kv}"), &trace, span);
                continue;
            }
            let t0 = Instant::now();
            b.execute(&step)?;
            times.push(&b, elapsed_ms(t0));
        }
        // The first run warms up (cuBLAS heuristics, allocations).
        let (med, gpu_ms, host_ms) = times.medians(1);
        let runs = &times.walls;
        let gap = a.gap_ms;
        eprintln!(
            "{model} ttft for {input_len} tokens, kv {kv}, skipped [{skipped}], {gap} ms idle before each: {med:.2} ms (runs {runs:.2?}); GPU span of the step {gpu_ms:.2?} ms; host prepare / launch / wait {host_ms:.2?} ms"
        );
        emit(
            json!({"figure": "ttft_b1_ms", "model": model, "kv_cache_dtype": kv, "input_len": input_len, "median_ms": med, "gpu_span_ms": gpu_ms, "host_prepare_launch_wait_ms": host_ms, "skipped": skipped, "gap_ms": gap}),
        );
        // One backend at a time: each holds most of the GPU's memory for its KV pool.
        drop(b);
    }
    Ok(())
}
