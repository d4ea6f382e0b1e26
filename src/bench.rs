//! `brook bench`: an offline workload (N prompts × input/output lengths, ignore_eos) through the
//! same engine the server uses; prints output tok/s and TTFT / ITL percentiles.

use std::time::{Duration, Instant};

use clap::Args;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::cli::EngineArgs;
use crate::engine::PreparedRequest;
use crate::request::StreamEvent;
use crate::sampling::params::SamplingParams;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Requests, all submitted at once.
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    /// Prompt tokens per request (random token ids).
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Output tokens per request (ignore_eos, so every request generates exactly this many).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the figures as one JSON object too.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub device: String,
    pub model: String,
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

/// Linear-interpolated percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

struct RequestTrace {
    ttft: Duration,
    itl: Vec<f64>,
    tokens: usize,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.num_prompts > 0 && args.input_len > 0 && args.output_len > 0,
        "--num-prompts, --input-len and --output-len must be > 0"
    );
    let cfg = args.engine.resolve()?;
    let (model_dir, _tmp) = crate::serve::resolve_model(&cfg)?;
    let system = actix::System::new();
    let report = system.block_on(async move {
        let engine = crate::engine::start(&cfg, &model_dir, true)?;
        eprintln!("{}", engine.info.summary());
        let vocab = engine.tokenizer.vocab_size() as u32;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(args.num_prompts);
        for _ in 0..args.num_prompts {
            let prompt_token_ids: Vec<u32> = (0..args.input_len)
                .map(|_| rng.random_range(0..vocab))
                .collect();
            let params = SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(args.output_len)
            };
            let (_, mut rx) = engine.submit(PreparedRequest {
                prompt_token_ids,
                params,
            });
            tasks.push(actix::spawn(async move {
                let sent = Instant::now();
                let mut last: Option<Instant> = None;
                let mut trace = RequestTrace {
                    ttft: Duration::ZERO,
                    itl: Vec::new(),
                    tokens: 0,
                };
                while let Some(ev) = rx.recv().await {
                    match ev {
                        StreamEvent::Delta { tokens, .. } => {
                            let now = Instant::now();
                            match last {
                                None => trace.ttft = now - sent,
                                Some(prev) => {
                                    let gap =
                                        (now - prev).as_secs_f64() * 1e3 / tokens.max(1) as f64;
                                    trace.itl.extend(std::iter::repeat_n(gap, tokens));
                                }
                            }
                            last = Some(now);
                        }
                        StreamEvent::Done { usage, .. } => trace.tokens = usage.completion_tokens,
                        StreamEvent::Error(e) => {
                            return Err(anyhow::anyhow!("request failed: {e}"))
                        }
                        StreamEvent::Started { .. } => {}
                    }
                }
                Ok(trace)
            }));
        }
        let mut traces = Vec::with_capacity(tasks.len());
        for t in tasks {
            traces.push(t.await??);
        }
        let wall = start.elapsed().as_secs_f64();
        let mut ttft: Vec<f64> = traces.iter().map(|t| t.ttft.as_secs_f64() * 1e3).collect();
        let mut itl: Vec<f64> = traces.iter().flat_map(|t| t.itl.iter().copied()).collect();
        ttft.sort_by(f64::total_cmp);
        itl.sort_by(f64::total_cmp);
        let completion_tokens: usize = traces.iter().map(|t| t.tokens).sum();
        Ok::<_, anyhow::Error>(BenchReport {
            device: engine.info.backend.device.clone(),
            model: engine.info.model_name.clone(),
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
        })
    })?;
    println!(
        "brook bench: {} prompts x {} in / {} out on {} ({})",
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
