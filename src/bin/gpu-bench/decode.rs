//! `gpu-bench decode`: batch-1 decode ms/token for brook's defaults, each setting changed alone,
//! and the default with one kind of launch left out (what each costs inside the step).

use std::time::Instant;

use brook::executor::backend::Backend;
use brook::executor::cuda::{CudaBackendOptions, KvCacheDtype};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{backend, bench_options, elapsed_ms, emit, median, one_seq_step, SKIPS};

/// Batch-1 greedy decode after a prompt: median step time over the run, for brook's defaults and
/// then one setting changed at a time.
pub fn run(
    model: &str,
    input_len: usize,
    output_len: usize,
    quick: bool,
    dtypes: &[KvCacheDtype],
) -> anyhow::Result<()> {
    for &dtype in dtypes {
        run_dtype(model, input_len, output_len, quick, dtype)?;
    }
    Ok(())
}

/// `run` for one KV cache dtype.
fn run_dtype(
    model: &str,
    input_len: usize,
    output_len: usize,
    quick: bool,
    dtype: KvCacheDtype,
) -> anyhow::Result<()> {
    let base = CudaBackendOptions {
        max_num_seqs: 8,
        max_num_batched_tokens: input_len.max(256),
        kv_cache_dtype: dtype,
        ..bench_options()
    };
    let variants = [
        base.clone(),
        CudaBackendOptions {
            gemv_bulk: !base.gemv_bulk,
            ..base.clone()
        },
        CudaBackendOptions {
            gemv_split: 1,
            ..base.clone()
        },
        CudaBackendOptions {
            gemv_split: 2,
            ..base.clone()
        },
        CudaBackendOptions {
            gemv_split: 4,
            ..base.clone()
        },
        CudaBackendOptions {
            fuse_decode: true,
            ..base.clone()
        },
        CudaBackendOptions {
            pdl: false,
            ..base.clone()
        },
        CudaBackendOptions {
            gemv_max_rows: 0,
            ..base.clone()
        },
        CudaBackendOptions {
            cuda_graphs: false,
            ..base.clone()
        },
    ];
    // What each kind of launch costs inside the step: the default with that kind left out.
    let variants = variants
        .into_iter()
        .map(|o| (o, ""))
        .chain(SKIPS.into_iter().map(|(name, bits)| {
            (
                CudaBackendOptions {
                    skip: bits,
                    ..base.clone()
                },
                name,
            )
        }));
    let count = if quick { 1 } else { usize::MAX };
    for (opts, skipped) in variants.take(count) {
        let (graphs, gemv, fuse, pdl, split, bulk) = (
            opts.cuda_graphs,
            opts.gemv_max_rows > 0,
            opts.fuse_decode,
            opts.pdl,
            opts.gemv_split,
            opts.gemv_bulk,
        );
        // The first 8 decode steps are warm-up, left out of the figure.
        anyhow::ensure!(
            output_len > 9,
            "--output-len must be at least 10 (the first 8 decode steps are not timed)"
        );
        let mut b = backend(model, opts)?;
        let bs = b.info().block_size;
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let vocab = b.config().vocab_size as u32;
        let prompt: Vec<u32> = (0..input_len).map(|_| rng.random_range(0..vocab)).collect();
        let blocks: Vec<u32> = (0..(input_len + output_len + 1).div_ceil(bs) as u32).collect();
        // A step with launches skipped samples from garbage: the backend keeps such tokens in
        // the vocabulary when `skip` is set.
        b.execute(&one_seq_step(1, &prompt, 0, input_len, &blocks, None))?;
        let mut steps = Vec::with_capacity(output_len);
        for i in 1..output_len {
            let pos = input_len + i - 1;
            let t0 = Instant::now();
            b.execute(&one_seq_step(1, &prompt, pos, 1, &blocks, None))?;
            steps.push(elapsed_ms(t0));
        }
        let warm = steps[8..].to_vec();
        let med = median(warm.clone());
        let mean = warm.iter().sum::<f64>() / warm.len() as f64;
        eprintln!(
            "{model} decode batch 1, kv {}, graphs {graphs}, gemv {gemv}, bulk {bulk}, split {split}, fused {fuse}, pdl {pdl}, skipped [{skipped}]: median {med:.3} ms/token, mean {mean:.3}",
            dtype.as_str()
        );
        emit(
            json!({"figure": "decode_b1_ms_per_token", "model": model, "kv_cache_dtype": dtype.as_str(), "cuda_graphs": graphs, "gemv": gemv, "gemv_bulk": bulk, "gemv_split": split, "fused": fuse, "pdl": pdl, "input_len": input_len, "output_len": output_len, "median_ms": med, "mean_ms": mean, "skipped": skipped}),
        );
    }
    Ok(())
}
