//! `gpu-bench ttft`: one prompt in one step (prefill + first token).

use std::time::Instant;

use brook::executor::backend::Backend;
use brook::executor::cuda::{CudaBackendOptions, KvCacheDtype};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{backend, bench_options, elapsed_ms, emit, median, one_seq_step};

/// One prompt in one step (prefill + first token), median of 5 on fresh blocks; once per KV
/// cache dtype.
pub fn run(model: &str, input_len: usize, dtypes: &[KvCacheDtype]) -> anyhow::Result<()> {
    for &dtype in dtypes {
        run_one(model, input_len, dtype)?;
    }
    Ok(())
}

fn run_one(model: &str, input_len: usize, dtype: KvCacheDtype) -> anyhow::Result<()> {
    let mut b = backend(
        model,
        CudaBackendOptions {
            max_num_seqs: 8,
            max_num_batched_tokens: input_len,
            kv_cache_dtype: dtype,
            ..bench_options()
        },
    )?;
    let bs = b.info().block_size;
    let vocab = b.config().vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut times = Vec::new();
    for rep in 0..6 {
        let tokens: Vec<u32> = (0..input_len).map(|_| rng.random_range(0..vocab)).collect();
        let per = input_len.div_ceil(bs) as u32;
        let blocks: Vec<u32> = (rep * per..(rep + 1) * per).collect();
        let last = rep.checked_sub(1).map(u64::from);
        let t0 = Instant::now();
        b.execute(&one_seq_step(
            rep.into(),
            &tokens,
            0,
            input_len,
            &blocks,
            last,
        ))?;
        times.push(elapsed_ms(t0));
    }
    let med = median(times[1..].to_vec());
    let kv = dtype.as_str();
    eprintln!("{model} ttft for {input_len} tokens, kv {kv}: {med:.2} ms (runs {times:.2?})");
    emit(
        json!({"figure": "ttft_b1_ms", "model": model, "kv_cache_dtype": kv, "input_len": input_len, "median_ms": med}),
    );
    Ok(())
}
