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
    /// Sampling temperature of every request (0 = greedy); each request has its own seed
    /// (--seed + its index), so sampled runs are reproducible.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// random: uniform random token ids; repeat: one random phrase of 16 ids repeated to
    /// --input-len (text that repeats itself, where n-gram lookup can find drafts).
    #[arg(long, value_enum, default_value_t = PromptKind::Random)]
    pub prompts: PromptKind,
    /// Print the figures as one JSON object too.
    #[arg(long)]
    pub json: bool,
    /// KV utilization of 256 mixed-length requests, paged vs contiguous (`bench::tiers`).
    #[arg(long, conflicts_with = "multiturn")]
    pub memory: bool,
    /// Returning users' TTFT with the KV host tier (--cpu-kv-cache-gib) vs recompute; users:
    /// --num-prompts, first turns: --input-len tokens (`bench::tiers`).
    #[arg(long, conflicts_with = "scheduler")]
    pub multiturn: bool,
    /// The scheduler's own host cost a step (`schedule` + `update_from_output` with the KV
    /// manager; no model, made-up outputs) for --num-prompts requests (`bench::host`).
    #[arg(long, conflicts_with = "memory")]
    pub scheduler: bool,
    /// The engine's own cost a step through its actors: the usual workload and figures, on a
    /// backend that computes nothing (`executor::null`), so the ITL is the time the scheduler
    /// actor, the executor thread's hand-overs and the output processor take a step.
    #[arg(long, conflicts_with_all = ["memory", "multiturn", "scheduler", "synthetic"])]
    pub engine_loop: bool,
    /// With --engine-loop: how long each step holds the executor thread, µs (as a GPU step's
    /// wait does). Default 4000, about a Llama-2-7B batch-1 step on an H200.
    #[arg(long)]
    pub step_us: Option<u64>,
}

/// How the benchmark's prompts are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptKind {
    Random,
    Repeat,
}

/// Tokens of the phrase a `repeat` prompt repeats.
const REPEAT_PHRASE: usize = 16;

mod host;
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
    pub temperature: f64,
    pub prompts: PromptKind,
    /// off | ngram | draft
    pub speculative: String,
    /// Speculative decoding over the timed workload: draft tokens verified and accepted, and
    /// tokens per verification (the target's own included); zero / None without it.
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    pub spec_mean_accepted_length: Option<f64>,
    /// Steps the executor ran over the timed workload, and its mean time in one (`execute`,
    /// from the scheduler's `step_time` metric: the backend's own host work included).
    pub steps: u64,
    pub executor_ms_mean: f64,
    /// The engine's own time a step, outside the executor: (wall - the steps' executor time) /
    /// steps, in µs. The actors' hops and the scheduler; any backend.
    pub outside_executor_us: f64,
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

impl PromptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PromptKind::Random => "random",
            PromptKind::Repeat => "repeat",
        }
    }
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

/// `--step-us` with `--engine-loop`, or its default.
fn engine_loop_step_us(args: &BenchArgs) -> u64 {
    args.step_us.unwrap_or(4000)
}

/// Starts the engine (a model folder, or `--synthetic` random weights) in an actix System of
/// its own, runs the workload and returns its figures.
pub fn execute(args: &BenchArgs) -> anyhow::Result<BenchOutcome> {
    check_sizes(args)?;
    let cfg = args.engine.resolve()?;
    let system = actix::System::new();
    if args.engine_loop {
        return system.block_on(async {
            let step = std::time::Duration::from_micros(engine_loop_step_us(args));
            let engine = crate::engine::start_null(&cfg, step)?;
            let vocab = engine.info.vocab_size;
            workload(&engine, vocab, args).await
        });
    }
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

/// `timed_workload`, then `EngineCore::shutdown`: the backend is gone before the process exits,
/// whatever the workload returned.
async fn workload(
    engine: &EngineCore,
    vocab: usize,
    args: &BenchArgs,
) -> anyhow::Result<BenchOutcome> {
    let outcome = timed_workload(engine, vocab, args).await;
    engine.shutdown().await;
    outcome
}

/// Submits `ignore_eos` greedy requests of random token ids below `vocab` and follows each
/// stream; the warm-up requests finish before the clock starts.
async fn timed_workload(
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
    let kind = args.prompts;
    let mut prompt = move || -> Vec<u32> {
        let distinct = match kind {
            PromptKind::Random => args.input_len,
            PromptKind::Repeat => REPEAT_PHRASE.min(args.input_len),
        };
        let phrase: Vec<u32> = (0..distinct).map(|_| rng.random_range(0..vocab)).collect();
        phrase
            .iter()
            .copied()
            .cycle()
            .take(args.input_len)
            .collect()
    };
    let next_seed = std::cell::Cell::new(args.seed);
    let submit = |prompt_token_ids: Vec<u32>, max_tokens: usize| -> anyhow::Result<_> {
        let seed = next_seed.get();
        next_seed.set(seed.wrapping_add(1));
        let req = engine.validate(GenerateRequest {
            input: PromptInput::Tokens(prompt_token_ids),
            params: RawSamplingParams {
                max_tokens: Some(max_tokens as i64),
                temperature: Some(args.temperature),
                seed: Some(seed),
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

    let before = engine.metrics.snapshot();
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
    let after = engine.metrics.snapshot();
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
    let steps = after.step_time.since(&before.step_time);
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
        temperature: args.temperature,
        prompts: args.prompts,
        speculative: engine.info.speculative.clone(),
        spec_draft_tokens: after.spec_draft_tokens - before.spec_draft_tokens,
        spec_accepted_tokens: after.spec_accepted_tokens - before.spec_accepted_tokens,
        spec_mean_accepted_length: {
            let drafts = after.spec_drafts - before.spec_drafts;
            let accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
            (drafts > 0).then(|| 1.0 + accepted as f64 / drafts as f64)
        },
        steps: steps.count,
        executor_ms_mean: steps.sum * 1e3 / steps.count.max(1) as f64,
        outside_executor_us: (wall - steps.sum) * 1e6 / steps.count.max(1) as f64,
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

/// Most requests a run takes: each holds its prompt, its stream and its figures in memory.
pub const MAX_BENCH_PROMPTS: usize = 1_000_000;

/// The workload's sizes (and `--step-us`, which only `--engine-loop` takes), for every mode.
fn check_sizes(args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.step_us.is_none() || args.engine_loop,
        "--step-us applies to --engine-loop only"
    );
    anyhow::ensure!(
        args.num_prompts > 0 && args.input_len > 0 && args.output_len > 0,
        "--num-prompts, --input-len and --output-len must be > 0"
    );
    anyhow::ensure!(
        args.num_prompts <= MAX_BENCH_PROMPTS,
        "--num-prompts {}: at most {MAX_BENCH_PROMPTS}",
        args.num_prompts
    );
    Ok(())
}

/// `--memory`, `--multiturn` and `--scheduler` load no checkpoint and (but `--multiturn`) run
/// no model: a model folder or a GPU asked of them is a mistake, not something to ignore.
/// The config and the engine flags are checked as `serve` checks them.
fn check_model_free(args: &BenchArgs) -> anyhow::Result<()> {
    let mode = match (args.memory, args.multiturn, args.engine_loop) {
        (true, _, _) => "--memory",
        (_, true, _) => "--multiturn",
        (_, _, true) => "--engine-loop",
        _ => "--scheduler",
    };
    anyhow::ensure!(
        args.engine.model.is_none(),
        "--model does not apply to bench {mode}: it runs without a checkpoint{}",
        if args.multiturn {
            " (random weights: --synthetic NAME, default tiny)"
        } else {
            ""
        }
    );
    // (`--device cpu` or `auto` asks for nothing these modes lack.)
    anyhow::ensure!(
        args.multiturn || args.engine.device.as_deref() != Some("cuda"),
        "--device cuda does not apply to bench {mode}: it runs no model"
    );
    args.engine.resolve()?;
    Ok(())
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    check_sizes(&args)?;
    if args.memory || args.multiturn || args.scheduler || args.engine_loop {
        check_model_free(&args)?;
    }
    if args.memory {
        return tiers::memory(&args);
    }
    if args.multiturn {
        return tiers::multiturn(&args);
    }
    if args.scheduler {
        return host::scheduler(&args);
    }
    let report = execute(&args)?.report;
    let weights = if report.synthetic {
        ", random weights"
    } else {
        ""
    };
    println!(
        "brook bench: {} prompts x {} in / {} out on {} ({}{weights}), {} prompts, \
         temperature {}, speculative {}",
        report.num_prompts,
        report.input_len,
        report.output_len,
        report.device,
        report.model,
        args.prompts.as_str(),
        report.temperature,
        report.speculative
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
    if args.engine_loop {
        // One token a step: the inter-token gap is the step's period.
        let step_ms = engine_loop_step_us(&args) as f64 / 1e3;
        println!(
            "  engine's own time a step (ITL - {step_ms} ms step) us  P50 {:>7.1}   P99 {:>7.1}",
            (report.itl_ms_p50 - step_ms) * 1e3,
            (report.itl_ms_p99 - step_ms) * 1e3
        );
    }
    println!(
        "  executor        {:>10.3} ms a step (mean of {} steps); outside it {:.1} us a step",
        report.executor_ms_mean, report.steps, report.outside_executor_us
    );
    if let Some(len) = report.spec_mean_accepted_length {
        println!(
            "  speculative     {} of {} drafts accepted ({:.1}%), {:.2} tokens per verification",
            report.spec_accepted_tokens,
            report.spec_draft_tokens,
            100.0 * report.spec_accepted_tokens as f64 / report.spec_draft_tokens.max(1) as f64,
            len
        );
    }
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
