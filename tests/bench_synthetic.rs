//! `brook bench --synthetic`: random weights of a known shape, no model folder and no tokenizer,
//! through the real engine (scheduler, KV manager and executor actors, CPU backend).

use brook::bench::{execute, BenchArgs, BenchOutcome};
use brook::cli::{Cli, Command};
use brook::engine::start_synthetic;
use brook::request::{FinishReason, StreamEvent};
use brook::sampling::params::RawSamplingParams;
use brook::validation::{GenerateRequest, PromptInput};
use clap::Parser;

/// The small CPU workload the tests start from, as `brook bench` flags; `overrides` replace
/// a flag's value or add a flag.
fn bench_args(overrides: &[(&str, &str)]) -> Result<BenchArgs, clap::Error> {
    let mut flags = vec![
        ("--synthetic", "tiny"),
        ("--device", "cpu"),
        ("--cpu-threads", "2"),
        ("--kv-cache-mib", "8"),
        ("--num-prompts", "6"),
        ("--input-len", "21"),
        ("--output-len", "9"),
        // Fewer slots than requests and a budget below one prompt: requests queue, prefills
        // are chunked and share steps with decodes.
        ("--max-num-seqs", "4"),
        ("--max-num-batched-tokens", "16"),
        ("--seed", "7"),
    ];
    for &(flag, value) in overrides {
        match flags.iter_mut().find(|(f, _)| *f == flag) {
            Some(slot) => slot.1 = value,
            None => flags.push((flag, value)),
        }
    }
    let argv = ["brook", "bench"]
        .into_iter()
        .chain(flags.iter().flat_map(|&(f, v)| [f, v]));
    match Cli::try_parse_from(argv)?.command {
        Command::Bench(args) => Ok(args),
        other => panic!("parsed as {other:?}"),
    }
}

fn run(overrides: &[(&str, &str)]) -> anyhow::Result<BenchOutcome> {
    execute(&bench_args(overrides).unwrap())
}

#[test]
fn synthetic_tiny_on_cpu_generates_every_requested_token() {
    let BenchOutcome { report, requests } = run(&[]).unwrap();
    assert_eq!(
        (report.model.as_str(), report.device.as_str()),
        ("tiny", "cpu")
    );
    assert!(report.synthetic);
    assert_eq!(
        (report.num_prompts, report.input_len, report.output_len),
        (6, 21, 9)
    );
    assert_eq!(requests.len(), 6);
    for r in &requests {
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(r.completion_tokens, 9);
        // No tokenizer: every step's token is still counted by a delta.
        assert_eq!(r.streamed_tokens, 9);
        assert!(r.ttft_ms > 0.0);
        // Tokens after the first delta; at least one delta follows it.
        assert!(!r.itl_ms.is_empty() && r.itl_ms.len() < 9, "{r:?}");
        assert!(r.itl_ms.iter().all(|&g| g.is_finite() && g >= 0.0));
    }
    assert_eq!(report.completion_tokens, 6 * 9);
    assert!(report.wall_s > 0.0);
    let out = report.completion_tokens as f64 / report.wall_s;
    assert!((report.output_tok_s - out).abs() <= 1e-9 * out);
    let total = (6 * (21 + 9)) as f64 / report.wall_s;
    assert!((report.total_tok_s - total).abs() <= 1e-9 * total);
    assert!(report.ttft_ms_p50 > 0.0 && report.ttft_ms_p50 <= report.ttft_ms_p99);
    assert!(report.itl_ms_p50 >= 0.0 && report.itl_ms_p50 <= report.itl_ms_p99);
    // Requests beyond max_num_seqs wait for a slot, so some first tokens come later.
    let ttft = |f: fn(f64, f64) -> f64| requests.iter().map(|r| r.ttft_ms).fold(f64::NAN, f);
    assert!(ttft(f64::max) > ttft(f64::min));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["model"], "tiny");
    assert_eq!(json["completion_tokens"], 54);
}

#[test]
fn workload_and_engine_flags_apply_unchanged() {
    let BenchOutcome { report, requests } = run(&[
        ("--num-prompts", "3"),
        ("--output-len", "4"),
        ("--input-len", "40"),
        ("--policy", "adaptive"),
        // The adaptive policy prefills a short prompt in one piece: the budget must hold it.
        ("--max-num-batched-tokens", "64"),
        ("--block-size", "8"),
        ("--warmup", "0"),
    ])
    .unwrap();
    assert_eq!(
        (report.num_prompts, report.input_len, report.output_len),
        (3, 40, 4)
    );
    assert_eq!(report.completion_tokens, 12);
    assert!(requests.iter().all(|r| r.streamed_tokens == 4));
}

#[test]
fn workload_longer_than_max_model_len_is_refused_up_front() {
    let err = run(&[("--max-model-len", "24")]).unwrap_err().to_string();
    assert!(err.contains("max_model_len 24"), "{err}");
}

#[test]
fn big_shapes_are_refused_on_the_cpu_with_the_alternative() {
    for name in ["llama-2-7b", "tinyllama-1.1b", "llama-3-8b"] {
        let err = format!("{:#}", run(&[("--synthetic", name)]).unwrap_err());
        assert!(
            err.contains("GPU") && err.contains("tiny") && err.contains("--device cpu"),
            "{err}"
        );
    }
}

#[test]
fn unknown_name_lists_the_known_ones_and_model_folder_conflicts() {
    let err = bench_args(&[("--synthetic", "gpt-2")])
        .unwrap_err()
        .to_string();
    for name in brook::model::synthetic::SYNTHETIC_MODELS {
        assert!(err.contains(name), "{err}");
    }
    let err = bench_args(&[("--model", "models/demo-chat")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("--model"), "{err}");
}

#[test]
fn token_level_engine_refuses_stop_strings_and_counts_tokens() {
    let mut cfg = bench_args(&[]).unwrap().engine.resolve().unwrap();
    cfg.scheduler.max_num_batched_tokens = 64;
    let system = actix::System::new();
    system.block_on(async {
        let engine = start_synthetic(&cfg, "tiny", 3).unwrap();
        let with_stop = GenerateRequest {
            input: PromptInput::Tokens(vec![5, 9, 300, 1200]),
            params: RawSamplingParams {
                max_tokens: Some(4),
                stop: Some(vec!["x".into()]),
                ..Default::default()
            },
            n: None,
        };
        let e = engine.validate(with_stop).unwrap_err();
        assert!(e.to_string().contains("tokenizer"), "{e}");
        let text = GenerateRequest {
            input: PromptInput::Text("hello".into()),
            params: RawSamplingParams::default(),
            n: None,
        };
        let e = engine.validate(text).unwrap_err();
        assert!(e.to_string().contains("token ids"), "{e}");
        let req = engine
            .validate(GenerateRequest {
                input: PromptInput::Tokens(vec![17, 4, 1999, 250, 3]),
                params: RawSamplingParams {
                    max_tokens: Some(5),
                    temperature: Some(0.0),
                    ignore_eos: Some(true),
                    ..Default::default()
                },
                n: None,
            })
            .unwrap();
        let (_, mut rx) = engine.submit(req);
        let mut counted = 0;
        loop {
            match rx.recv().await.expect("stream ended early") {
                StreamEvent::Delta { text, tokens, .. } => {
                    assert!(text.is_empty());
                    counted += tokens;
                }
                StreamEvent::Done { usage, .. } => {
                    assert_eq!(usage.completion_tokens, 5);
                    break;
                }
                StreamEvent::Started { prompt_tokens } => assert_eq!(prompt_tokens, 5),
                StreamEvent::ChoiceDone { .. } => panic!("n = 1 has no choice_done"),
                StreamEvent::Error(e) => panic!("{e}"),
            }
        }
        assert_eq!(counted, 5);
    });
}

/// `brook bench --scheduler` drives every request to its last token through the scheduler and
/// KV manager alone (it fails when a step schedules nothing or a token is missing), with queued
/// requests and chunked prefills (4 slots, a 16-token budget, 21-token prompts), in both
/// policies.
#[test]
fn scheduler_host_cost_runs_every_request_to_the_end() {
    for policy in ["fcfs", "adaptive"] {
        let mut args = bench_args(&[("--policy", policy)]).unwrap();
        args.scheduler = true;
        brook::bench::run(args).unwrap_or_else(|e| panic!("{policy}: {e:#}"));
    }
}

/// `--engine-loop`: the usual workload through the real actors on the null backend, which
/// holds the executor thread for `--step-us` a step. Every token arrives, no step is shorter
/// than the time it holds, and the scheduler's pre-wake (on: the null backend is not the CPU
/// executor) changes no output. `--step-us` belongs to `--engine-loop` alone.
#[test]
fn engine_loop_runs_the_workload_on_the_null_backend() {
    let e = run(&[("--step-us", "300")]).unwrap_err().to_string();
    assert!(e.contains("--engine-loop"), "{e}");
    let args = Cli::try_parse_from([
        "brook",
        "bench",
        "--engine-loop",
        "--step-us",
        "300",
        "--num-prompts",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "40",
    ])
    .map(|c| match c.command {
        Command::Bench(a) => a,
        other => panic!("parsed as {other:?}"),
    })
    .unwrap();
    let BenchOutcome { report, requests } = execute(&args).unwrap();
    assert_eq!(report.device, "null (no model)");
    assert_eq!(requests.len(), 3);
    for r in &requests {
        assert_eq!(
            (r.finish_reason, r.completion_tokens),
            (FinishReason::Length, 40)
        );
    }
    // Steps follow one another, each at least the 0.3 ms the backend holds.
    assert!(report.itl_ms_p50 >= 0.3, "{}", report.itl_ms_p50);
    // The executor's share comes from the step metric: every step it ran held it 0.3 ms, at
    // least 40 of them (prompts join together or in turn); the rest of the wall is the
    // engine's own, and positive.
    assert!(report.steps >= 40, "{} steps", report.steps);
    assert!(
        report.executor_ms_mean >= 0.3,
        "{}",
        report.executor_ms_mean
    );
    let wall_us = report.wall_s * 1e6;
    let executor_us = report.executor_ms_mean * 1e3 * report.steps as f64;
    assert!(executor_us < wall_us, "{executor_us} of {wall_us}");
    assert!(
        report.outside_executor_us > 0.0,
        "{}",
        report.outside_executor_us
    );
    let conflict = Cli::try_parse_from(["brook", "bench", "--engine-loop", "--synthetic", "tiny"]);
    assert!(conflict.is_err(), "--engine-loop runs no model");
}
