//! `brook bench --memory` and `brook bench --multiturn`: the KV memory tier's figures.
//!
//! --memory: 256 requests of mixed lengths (seeded: prompts 16..1024, outputs 16..512 tokens)
//! grow through the real KV manager (prefill, then one token at a time) and all stay resident;
//! at the peak, the token slots they hold against the blocks taken (paged), and against what a
//! contiguous per-request allocation needs (each request reserves prompt + max_tokens slots up
//! front, as a system without paging must). Utilization = tokens stored / slots reserved.
//!
//! --multiturn: more users than the device tier holds each send a long first turn, then each
//! returns with that conversation plus a short new message; the returning turns' TTFT with the
//! host tier (their prefix comes back from host memory) against without it (recomputed). Turns
//! go one at a time, so TTFT is the prefill's, not queueing.

use rand::{Rng, SeedableRng};

use super::{follow, percentile, BenchArgs};
use crate::engine::EngineCore;
use crate::kv::KvCacheManager;
use crate::request::RequestId;
use crate::sampling::params::RawSamplingParams;
use crate::validation::{GenerateRequest, PromptInput};

/// `--memory`: paged vs contiguous KV utilization.
pub fn memory(args: &BenchArgs) -> anyhow::Result<()> {
    // The block size the config and flags give, checked as `serve` checks it.
    let bs = args.engine.resolve()?.cache.block_size;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let n = 256;
    let reqs: Vec<(usize, usize)> = (0..n)
        .map(|_| (rng.random_range(16..=1024), rng.random_range(16..=512)))
        .collect();
    let total: usize = reqs.iter().map(|(p, o)| (p + o).div_ceil(bs)).sum();
    let mut kv = KvCacheManager::new(total, bs, false);
    let mut len = vec![0usize; n];
    for (i, &(p, _)) in reqs.iter().enumerate() {
        kv.allocate_slots(RequestId(i as u64), 0, p)
            .ok_or_else(|| anyhow::anyhow!("pool too small"))?;
        len[i] = p;
    }
    // Decode, all requests interleaved, until each has its outputs.
    let longest = reqs.iter().map(|r| r.1).max().unwrap_or(0);
    for step in 0..longest {
        for (i, &(p, o)) in reqs.iter().enumerate() {
            if step < o {
                kv.allocate_slots(RequestId(i as u64), len[i], 1)
                    .ok_or_else(|| anyhow::anyhow!("pool too small"))?;
                len[i] = p + step + 1;
            }
        }
    }
    let stored: usize = len.iter().sum();
    let paged_slots = kv.usage().used_blocks * bs;
    let contiguous_slots: usize = reqs.iter().map(|(p, o)| p + o).sum();
    // A contiguous allocator that cannot know max_tokens reserves the context length.
    let ctx = args.engine.max_model_len.unwrap_or(2048).max(1024 + 512);
    let contiguous_ctx_slots = n * ctx;
    let paged = stored as f64 / paged_slots as f64;
    println!(
        "brook bench --memory: {n} requests, prompts 16..1024, outputs 16..512, block size {bs}, seed {}",
        args.seed
    );
    println!("  tokens stored at the peak:       {stored}");
    println!(
        "  paged (brook):                   {paged_slots} slots, utilization {:.2}%",
        paged * 100.0
    );
    println!(
        "  contiguous, prompt + max_tokens: {contiguous_slots} slots, utilization {:.2}% (paged needs {:.2}% of its memory)",
        stored as f64 / contiguous_slots as f64 * 100.0,
        paged_slots as f64 / contiguous_slots as f64 * 100.0
    );
    println!(
        "  contiguous, context {ctx}:        {contiguous_ctx_slots} slots, utilization {:.2}%",
        stored as f64 / contiguous_ctx_slots as f64 * 100.0
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "requests": n, "block_size": bs, "tokens_stored": stored,
                "paged_slots": paged_slots, "paged_utilization": paged,
                "contiguous_slots": contiguous_slots,
                "contiguous_utilization": stored as f64 / contiguous_slots as f64,
                "contiguous_ctx_slots": contiguous_ctx_slots,
            })
        );
    }
    Ok(())
}

/// `--multiturn`: returning users' TTFT with and without the host tier.
pub fn multiturn(args: &BenchArgs) -> anyhow::Result<()> {
    let name = args.synthetic.clone().unwrap_or_else(|| "tiny".to_string());
    let with_host = args.engine.resolve()?;
    anyhow::ensure!(
        with_host.cache.cpu_kv_cache_gib > 0.0,
        "--multiturn compares against a host tier: give --cpu-kv-cache-gib"
    );
    let mut without = with_host.clone();
    without.cache.cpu_kv_cache_gib = 0.0;
    let users = args.num_prompts;
    let mut figures = Vec::new();
    for (label, cfg) in [("host tier", &with_host), ("recompute", &without)] {
        let system = actix::System::new();
        let ttft = system.block_on(async {
            let engine = crate::engine::start_synthetic(cfg, &name, args.seed)?;
            eprintln!("{}", engine.info.summary());
            let ttft = returning_ttft(&engine, users, args).await;
            // Its GPU memory is free before the next engine starts.
            engine.shutdown().await;
            ttft
        })?;
        figures.push((label, ttft));
    }
    println!(
        "brook bench --multiturn: {users} users x {} prompt tokens, then +{} tokens; {} output tokens per turn ({name}, random weights)",
        args.input_len, 16, args.output_len
    );
    for (label, t) in &figures {
        println!(
            "  returning users' TTFT, {label:9}: p50 {:8.2} ms  mean {:8.2} ms",
            percentile(t, 50.0),
            t.iter().sum::<f64>() / t.len() as f64
        );
    }
    let ratio = percentile(&figures[1].1, 50.0) / percentile(&figures[0].1, 50.0);
    println!("  recompute / host tier (p50): {ratio:.2}x");
    Ok(())
}

/// Every user's first turn, then every user's return, one request at a time; the returns' TTFT.
async fn returning_ttft(
    engine: &EngineCore,
    users: usize,
    args: &BenchArgs,
) -> anyhow::Result<Vec<f64>> {
    let vocab = engine.info.vocab_size as u32;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let firsts: Vec<Vec<u32>> = (0..users)
        .map(|_| {
            (0..args.input_len)
                .map(|_| rng.random_range(0..vocab))
                .collect()
        })
        .collect();
    let turn = |prompt: Vec<u32>| -> anyhow::Result<_> {
        let req = engine.validate(GenerateRequest {
            input: PromptInput::Tokens(prompt),
            params: RawSamplingParams {
                max_tokens: Some(args.output_len as i64),
                temperature: Some(0.0),
                ignore_eos: Some(true),
                ..Default::default()
            },
            n: None,
        })?;
        let (_, rx) = engine.submit(req);
        Ok(follow(rx))
    };
    for p in &firsts {
        turn(p.clone())?.await?;
    }
    let mut ttft = Vec::with_capacity(users);
    for p in &firsts {
        let mut next = p.clone();
        next.extend((0..16).map(|_| rng.random_range(0..vocab)));
        ttft.push(turn(next)?.await?.ttft_ms);
    }
    Ok(ttft)
}
