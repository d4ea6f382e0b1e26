//! `gpu-bench cold`: what a fresh backend's first steps cost against the same steps warm — the
//! first prefills (cuBLAS's and the kernels' first use) and the first pure-decode steps at each
//! batch size (a CUDA graph captured on a bucket's first use): the latency that a server's first
//! requests, and its first visit to each batch size, pay with no warm-up at start.

use std::sync::Arc;
use std::time::Instant;

use brook::executor::backend::Backend;
use brook::executor::cuda::CudaBackendOptions;
use brook::sampling::params::SamplingParams;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{backend, bench_options, elapsed_ms, emit, fresh_prompt_step, PrefixHitBatch};

pub struct Args<'a> {
    pub model: &'a str,
    /// Prompt tokens of each prefill.
    pub input_len: usize,
    /// Decode batch sizes, in the order visited.
    pub batches: &'a [usize],
    /// Context of each decoding sequence.
    pub context: usize,
    /// The backend warms up at start (`CudaBackendOptions::warm_up`).
    pub warm_up: bool,
}

/// Decode steps timed at each batch size (the first enters the sequences).
const DECODE_STEPS: usize = 4;
/// Prefills timed (the first is cold).
const PREFILLS: usize = 3;

pub fn run(a: &Args) -> anyhow::Result<()> {
    let most = a.batches.iter().copied().max().unwrap_or(1);
    let started = Instant::now();
    let mut b = backend(
        a.model,
        CudaBackendOptions {
            max_num_seqs: most.max(8),
            max_num_batched_tokens: a.input_len.max(most),
            warm_up: a.warm_up,
            ..bench_options()
        },
    )?;
    let startup_ms = elapsed_ms(started);
    let bs = b.info().block_size;
    let vocab = b.config().vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let per_prompt = a.input_len.div_ceil(bs);
    let warm = a.warm_up;
    let mut prefill_ms = Vec::new();
    for rep in 0..PREFILLS {
        let step = fresh_prompt_step(rep, a.input_len, bs, vocab, &mut rng);
        let t0 = Instant::now();
        b.execute(&step)?;
        prefill_ms.push(elapsed_ms(t0));
    }
    eprintln!(
        "{} cold (warm-up {warm}): backend ready in {startup_ms:.0} ms; prefills of {} tokens {prefill_ms:.2?} ms",
        a.model, a.input_len
    );
    emit(
        json!({"figure": "cold_prefill_ms", "model": a.model, "warm_up": warm, "input_len": a.input_len, "startup_ms": startup_ms, "runs_ms": prefill_ms}),
    );
    // Decoding sequences take ids and blocks after the prefills'; each batch size's are new.
    let per_seq = (a.context + DECODE_STEPS).div_ceil(bs);
    let first_block_seq = (PREFILLS * per_prompt).div_ceil(per_seq);
    let params = Arc::new(SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(DECODE_STEPS + 1)
    });
    let mut finished = vec![brook::request::RequestId(PREFILLS as u64 - 1)];
    let mut first_id = first_block_seq.max(PREFILLS);
    for &batch in a.batches {
        let seqs = PrefixHitBatch {
            first_id,
            batch,
            context: a.context,
            per_seq,
            vocab,
            params: params.clone(),
        };
        anyhow::ensure!(
            (first_id + batch) * per_seq <= b.info().num_kv_blocks,
            "the batches need more than the pool's {} blocks",
            b.info().num_kv_blocks
        );
        let mut steps_ms = Vec::new();
        for i in 0..DECODE_STEPS {
            let mut out = seqs.step(i);
            if i == 0 {
                out.finished_req_ids = std::mem::take(&mut finished);
            }
            let t0 = Instant::now();
            b.execute(&out)?;
            steps_ms.push(elapsed_ms(t0));
        }
        eprintln!(
            "{} cold (warm-up {warm}): decode batch {batch} at context {}: steps {steps_ms:.2?} ms (the first enters the sequences)",
            a.model, a.context
        );
        emit(
            json!({"figure": "cold_decode_ms", "model": a.model, "warm_up": warm, "batch": batch, "context": a.context, "steps_ms": steps_ms}),
        );
        finished = seqs.ids();
        first_id += batch;
    }
    Ok(())
}
