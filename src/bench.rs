//! `brook bench`: an offline workload (N prompts × input/output lengths, ignore_eos) through the
//! same engine the server uses; prints output tok/s and TTFT / ITL percentiles. The model is a
//! folder, or with `--synthetic NAME` random weights of a known model's shapes (no checkpoint,
//! no tokenizer).

use std::time::{Duration, Instant};

use clap::builder::PossibleValuesParser;
use clap::Args;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::engine::EngineCore;
use crate::engine_args::EngineArgs;
use crate::model::synthetic::SYNTHETIC_MODELS;
use crate::request::{FinishReason, StreamEvent};
use crate::sampling::params::RawSamplingParams;
use crate::validation::{GenerateRequest, PromptInput};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Random weights of a known model's shapes instead of a model folder, generated on the GPU
    /// (on the CPU only `tiny`); no tokenizer, so the stream carries token counts, not text.
    #[arg(long, value_name = "NAME", conflicts_with = "model",
          value_parser = PossibleValuesParser::new(SYNTHETIC_MODELS))]
    pub synthetic: Option<String>,
    /// Requests, all submitted at once.
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    /// Prompt tokens per request (random token ids).
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Output tokens per request (ignore_eos, so every request generates exactly this many).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Seed of the prompts' token ids (and of --synthetic weights).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Requests (an --input-len prompt, up to 8 output tokens) run before the timed workload,
    /// so one-time costs (cuBLAS heuristics, the first CUDA graph) stay out of the figures.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Print the figures as one JSON object too.
    #[arg(long)]
    pub json: bool,
    /// KV utilization of 256 mixed-length requests, paged vs contiguous (`bench::tiers`).
    #[arg(long, conflicts_with = "multiturn")]
    pub memory: bool,
    /// Returning users' TTFT with the KV host tier (--cpu-kv-cache-gib) vs recompute; users:
    /// --num-prompts, first turns: --input-len tokens (`bench::tiers`).
    #[arg(long)]
    pub multiturn: bool,
}

mod tiers;

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub device: String,
    /// The model folder's name, or the synthetic shape's.
    pub model: String,
    /// Random weights of the shape named by `model` (`--synthetic`).
    pub synthetic: bool,
    pub num_prompts: usize,
    pub input_len: usize,
    pub output_len: usize,
    pub wall_s: f64,
    pub output_tok_s: f64,
    pub total_tok_s: f64,
    pub ttft_ms_p50: f64,
    pub ttft_ms_p99: f64,
    pub itl_ms_p50: f64,
    pub itl_ms_p99: f64,
    pub completion_tokens: usize,
}

/// What one timed request saw on its stream.
#[derive(Debug, Clone)]
pub struct RequestStats {
    pub ttft_ms: f64,
    /// One entry per token after the first delta's; a delta of n tokens spreads its wait evenly.
    pub itl_ms: Vec<f64>,
    /// Tokens the deltas counted.
    pub streamed_tokens: usize,
    /// Tokens the final usage reported.
    pub completion_tokens: usize,
    pub finish_reason: FinishReason,
}

/// The report and the per-request figures it was computed from.
#[derive(Debug)]
pub struct BenchOutcome {
    pub report: BenchReport,
    pub requests: Vec<RequestStats>,
}

/// Linear-interpolated percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// Starts the engine (a model folder, or `--synthetic` random weights) in an actix System of
/// its own, runs the workload and returns its figures.
pub fn execute(args: &BenchArgs) -> anyhow::Result<BenchOutcome> {
    anyhow::ensure!(
        args.num_prompts > 0 && args.input_len > 0 && args.output_len > 0,
        "--num-prompts, --input-len and --output-len must be > 0"
    );
    let cfg = args.engine.resolve()?;
    let system = actix::System::new();
    match &args.synthetic {
        Some(name) => system.block_on(async {
            let engine = crate::engine::start_synthetic(&cfg, name, args.seed)?;
            let vocab = engine.info.vocab_size;
            workload(&engine, vocab, args).await
        }),
        None => {
            let model_dir = crate::serve::resolve_model(&cfg)?;
            system.block_on(async {
                let engine = crate::engine::start(&cfg, &model_dir, true)?;
                // Ids the tokenizer knows: the detokenizer runs on every output.
                let vocab = engine.tokenizer.vocab_size();
                workload(&engine, vocab, args).await
            })
        }
    }
}

/// Submits `ignore_eos` greedy requests of random token ids below `vocab` and follows each
/// stream; the warm-up requests finish before the clock starts.
async fn workload(
    engine: &EngineCore,
    vocab: usize,
    args: &BenchArgs,
) -> anyhow::Result<BenchOutcome> {
    eprintln!("{}", engine.info.summary());
    let longest = args.input_len + args.output_len;
    anyhow::ensure!(
        longest <= engine.info.max_model_len,
        "--input-len + --output-len ({longest}) exceeds max_model_len {}",
        engine.info.max_model_len
    );
    let vocab = vocab as u32;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let mut prompt = move || -> Vec<u32> {
        (0..args.input_len)
            .map(|_| rng.random_range(0..vocab))
            .collect()
    };
    let submit = |prompt_token_ids: Vec<u32>, max_tokens: usize| -> anyhow::Result<_> {
        let req = engine.validate(GenerateRequest {
            input: PromptInput::Tokens(prompt_token_ids),
            params: RawSamplingParams {
                max_tokens: Some(max_tokens as i64),
                temperature: Some(0.0),
                ignore_eos: Some(true),
                ..Default::default()
            },
            n: None,
        })?;
        let (_, rx) = engine.submit(req);
        Ok(actix::spawn(follow(rx)))
    };
    // The warm-up prompts come after the timed ones in the seed's stream, so the timed prompts
    // do not depend on --warmup.
    let timed_prompts: Vec<Vec<u32>> = (0..args.num_prompts).map(|_| prompt()).collect();
    let warm = (0..args.warmup)
        .map(|_| submit(prompt(), args.output_len.min(8)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for w in warm {
        w.await??;
    }

    let start = Instant::now();
    let tasks = timed_prompts
        .into_iter()
        .map(|p| submit(p, args.output_len))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut requests = Vec::with_capacity(tasks.len());
    for t in tasks {
        requests.push(t.await??);
    }
    let wall = start.elapsed().as_secs_f64();
    // ignore_eos within max_model_len: anything short means the figures are wrong.
    if let Some(r) = requests
        .iter()
        .find(|r| r.completion_tokens != args.output_len)
    {
        anyhow::bail!(
            "a request generated {} tokens ({:?}), not --output-len {}",
            r.completion_tokens,
            r.finish_reason,
            args.output_len
        );
    }
    let mut ttft: Vec<f64> = requests.iter().map(|r| r.ttft_ms).collect();
    let mut itl: Vec<f64> = requests
        .iter()
        .flat_map(|r| r.itl_ms.iter().copied())
        .collect();
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    let completion_tokens: usize = requests.iter().map(|r| r.completion_tokens).sum();
    let report = BenchReport {
        device: engine.info.backend.device.clone(),
        model: engine.info.model_name.clone(),
        synthetic: args.synthetic.is_some(),
        num_prompts: args.num_prompts,
        input_len: args.input_len,
        output_len: args.output_len,
        wall_s: wall,
        output_tok_s: completion_tokens as f64 / wall,
        total_tok_s: (completion_tokens + args.num_prompts * args.input_len) as f64 / wall,
        ttft_ms_p50: percentile(&ttft, 50.0),
        ttft_ms_p99: percentile(&ttft, 99.0),
        itl_ms_p50: percentile(&itl, 50.0),
        itl_ms_p99: percentile(&itl, 99.0),
        completion_tokens,
    };
    Ok(BenchOutcome { report, requests })
}

/// Reads one request's stream to its end, timing its deltas.
async fn follow(mut rx: mpsc::Receiver<StreamEvent>) -> anyhow::Result<RequestStats> {
    let sent = Instant::now();
    let mut last: Option<Instant> = None;
    let mut ttft = Duration::ZERO;
    let (mut itl_ms, mut streamed_tokens) = (Vec::new(), 0);
    while let Some(ev) = rx.recv().await {
        match ev {
            StreamEvent::Delta { tokens, .. } => {
                let now = Instant::now();
                match last {
                    None => ttft = now - sent,
                    Some(prev) => {
                        let gap = (now - prev).as_secs_f64() * 1e3 / tokens.max(1) as f64;
                        itl_ms.extend(std::iter::repeat_n(gap, tokens));
                    }
                }
                last = Some(now);
                streamed_tokens += tokens;
            }
            StreamEvent::Done {
                usage,
                finish_reason,
                ..
            } => {
                return Ok(RequestStats {
                    ttft_ms: ttft.as_secs_f64() * 1e3,
                    itl_ms,
                    streamed_tokens,
                    completion_tokens: usage.completion_tokens,
                    finish_reason,
                })
            }
            StreamEvent::Error(e) => anyhow::bail!("request failed: {e}"),
            StreamEvent::Started { .. } | StreamEvent::ChoiceDone { .. } => {}
        }
    }
    anyhow::bail!("a request's stream ended without a terminal event")
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.memory {
        return tiers::memory(&args);
    }
    if args.multiturn {
        return tiers::multiturn(&args);
    }
    let report = execute(&args)?.report;
    let weights = if report.synthetic {
        ", random weights"
    } else {
        ""
    };
    println!(
        "brook bench: {} prompts x {} in / {} out on {} ({}{weights})",
        report.num_prompts, report.input_len, report.output_len, report.device, report.model
    );
    println!("  wall            {:>10.2} s", report.wall_s);
    println!("  output tok/s    {:>10.1}", report.output_tok_s);
    println!("  total tok/s     {:>10.1}", report.total_tok_s);
    println!(
        "  TTFT ms  P50 {:>9.1}   P99 {:>9.1}",
        report.ttft_ms_p50, report.ttft_ms_p99
    );
    println!(
        "  ITL  ms  P50 {:>9.2}   P99 {:>9.2}",
        report.itl_ms_p50, report.itl_ms_p99
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentile_interpolates() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&v, 50.0), 3.0);
        assert_eq!(percentile(&v, 100.0), 5.0);
        assert!((percentile(&v, 99.0) - 4.96).abs() < 1e-9);
    }
}
