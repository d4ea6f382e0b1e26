//! `gpu-bench offline`: N requests submitted at once through brook's own `Scheduler` and
//! `KvCacheManager`, step by step (no actors, no tokenizer): executor and scheduler together.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use brook::executor::backend::Backend;
use brook::executor::cuda::{CudaBackend, CudaBackendOptions, KvCacheDtype};
use brook::kv::KvCacheManager;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{backend, bench_options, elapsed_ms, emit, execute, median};
use crate::variants::variant_options;

/// All requests submitted at once, ignore_eos, greedy; brook's scheduler decides every step.
/// Once per variant (`variants::variant_options`, without the step stamps), each on a fresh
/// backend: in its own process when there are several (`isolate`); the KV cache dtypes of one
/// variant share its process.
#[allow(clippy::too_many_arguments)]
pub fn run(
    model: &str,
    n: usize,
    input_len: usize,
    output_len: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    graphs: bool,
    variants: &[String],
    dtypes: &[KvCacheDtype],
) -> anyhow::Result<()> {
    let base = CudaBackendOptions {
        max_num_seqs,
        max_num_batched_tokens,
        cuda_graphs: graphs,
        ..bench_options()
    };
    for &kv_cache_dtype in dtypes {
        for name in variants {
            let opts = CudaBackendOptions {
                step_timing: false,
                kv_cache_dtype,
                ..variant_options(name, &base)?
            };
            let b = backend(model, opts)?;
            run_one(
                b,
                name,
                model,
                n,
                (input_len, output_len),
                &base,
                kv_cache_dtype,
            )?;
        }
    }
    Ok(())
}

fn run_one(
    mut b: CudaBackend,
    variant: &str,
    model: &str,
    n: usize,
    (input_len, output_len): (usize, usize),
    base: &CudaBackendOptions,
    dtype: KvCacheDtype,
) -> anyhow::Result<()> {
    let (max_num_seqs, max_num_batched_tokens, graphs) = (
        base.max_num_seqs,
        base.max_num_batched_tokens,
        base.cuda_graphs,
    );
    let info = b.info();
    let vocab = b.config().vocab_size as u32;
    let max_model_len = b.config().max_position_embeddings;
    // As the engine builds it: a windowed model (phi-3-mini) frees blocks behind its window.
    let mut kv = KvCacheManager::new(info.num_kv_blocks, info.block_size, true)
        .with_sliding_window(b.config().sliding_window);
    let mut sched = Scheduler::new(SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        long_prefill_token_threshold: 0,
        ..Default::default()
    });
    // The scheduler runs on explicit time (seconds since `clock`).
    let clock = Instant::now();
    let now = || clock.elapsed().as_secs_f64();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let params = Arc::new(SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(output_len)
    });
    let eos: Arc<[u32]> = Arc::from(vec![2u32]);
    // A warm-up request first: graph capture and cuBLAS heuristics stay out of the timing.
    let warm = NewRequest {
        id: RequestId(u64::MAX),
        prompt_token_ids: (0..input_len).map(|_| rng.random_range(0..vocab)).collect(),
        params: Arc::new(SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(8)
        }),
        seed: 0,
        eos_token_ids: eos.clone(),
        n: 1,
    };
    anyhow::ensure!(
        matches!(sched.add_request(warm, now()), Admission::Accepted),
        "warm-up request refused"
    );
    while sched.has_unfinished() {
        let out = sched.schedule(&mut kv, now());
        let step = execute(&mut b, &out)?;
        sched.update_from_output(&out, &step, &mut kv, now());
    }
    let started = Instant::now();
    for i in 0..n as u64 {
        let prompt: Vec<u32> = (0..input_len).map(|_| rng.random_range(0..vocab)).collect();
        let req = NewRequest {
            id: RequestId(i),
            prompt_token_ids: prompt,
            params: params.clone(),
            seed: i,
            eos_token_ids: eos.clone(),
            n: 1,
        };
        let admitted = sched.add_request(req, now());
        anyhow::ensure!(
            matches!(admitted, Admission::Accepted),
            "request {i} refused: {admitted:?}"
        );
    }
    let (mut steps, mut generated, mut first_token) = (0usize, 0usize, vec![None; n]);
    let mut step_ms = Vec::new();
    while sched.has_unfinished() {
        let out = sched.schedule(&mut kv, now());
        let t0 = Instant::now();
        let step = execute(&mut b, &out)?;
        step_ms.push((
            out.total_num_scheduled_tokens(),
            out.scheduled.len(),
            elapsed_ms(t0),
        ));
        for s in &step.sampled {
            generated += 1;
            first_token[s.request_id.0 as usize].get_or_insert(started.elapsed());
        }
        sched.update_from_output(&out, &step, &mut kv, now());
        steps += 1;
    }
    let wall = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        generated == n * output_len,
        "generated {generated} tokens, expected {}",
        n * output_len
    );
    let mut ttft: Vec<f64> = first_token
        .iter()
        .map(|t| {
            t.context("a request never produced a token")
                .map(|d| d.as_secs_f64() * 1e3)
        })
        .collect::<anyhow::Result<_>>()?;
    ttft.sort_by(f64::total_cmp);
    let exec_ms: f64 = step_ms.iter().map(|s| s.2).sum();
    let decode_steps: Vec<f64> = step_ms
        .iter()
        .filter(|s| s.0 == s.1 && s.1 > 0)
        .map(|s| s.2)
        .collect();
    let largest_decode = step_ms
        .iter()
        .filter(|s| s.0 == s.1)
        .map(|s| s.1)
        .max()
        .unwrap_or(0);
    let out_tok_s = generated as f64 / wall;
    eprintln!(
        "{model} [{variant}, kv {}] offline {n} x {input_len}/{output_len}: {wall:.2} s, {out_tok_s:.0} output tok/s, {steps} steps ({:.0}% of wall in execute), median decode step {:.2} ms (largest decode batch {largest_decode}), ttft p50 {:.0} ms",
        dtype.as_str(),
        exec_ms / 10.0 / wall,
        median(decode_steps.clone()),
        ttft[n / 2]
    );
    emit(json!({
        "figure": "offline_out_tok_s", "variant": variant, "kv_cache_dtype": dtype.as_str(), "num_kv_blocks": info.num_kv_blocks, "model": model, "num_prompts": n, "input_len": input_len, "output_len": output_len,
        "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens, "cuda_graphs": graphs,
        "wall_s": wall, "output_tok_s": out_tok_s, "total_tok_s": (n * (input_len + output_len)) as f64 / wall,
        "steps": steps, "execute_share": exec_ms / 1e3 / wall, "median_decode_step_ms": median(decode_steps),
        "ttft_ms_p50": ttft[n / 2], "ttft_ms_p99": ttft[(n * 99) / 100],
    }));
    Ok(())
}
