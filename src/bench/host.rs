//! `brook bench --scheduler`: the host's own cost per engine step, without a model. The
//! requests go through the real `Scheduler` and `KvCacheManager` (the config's policy, token
//! budget and prefix caching); each step's output is made up (one fixed token per sampling
//! sequence, ignore_eos), so what is timed is `schedule` and `update_from_output` alone: the
//! part of the gap between two GPU steps that is brook's and grows with the batch.

use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde_json::json;

use super::{percentile, BenchArgs};
use crate::kv::KvCacheManager;
use crate::request::RequestId;
use crate::sampling::params::SamplingParams;
use crate::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use crate::step::{SampledToken, StepOutput};

/// µs figures of one kind of step.
#[derive(Default)]
struct Times {
    schedule: Vec<f64>,
    update: Vec<f64>,
}

impl Times {
    /// (p50, p99) of each, sorted in place.
    fn summary(&mut self) -> [(f64, f64); 2] {
        [&mut self.schedule, &mut self.update].map(|v| {
            v.sort_by(f64::total_cmp);
            (percentile(v, 50.0), percentile(v, 99.0))
        })
    }
}

pub fn scheduler(args: &BenchArgs) -> anyhow::Result<()> {
    let cfg = args.engine.resolve()?;
    let max_len = args.input_len + args.output_len + 1;
    let sc = SchedulerConfig {
        max_model_len: max_len,
        ..cfg.scheduler.clone()
    };
    let bs = cfg.cache.block_size;
    let blocks = args.num_prompts * max_len.div_ceil(bs) + 16;
    let mut kv = KvCacheManager::new(blocks, bs, cfg.cache.enable_prefix_caching);
    let mut sched = Scheduler::new(sc.clone());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let params = Arc::new(SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(args.output_len)
    });
    for i in 0..args.num_prompts {
        let req = NewRequest {
            id: RequestId(i as u64),
            prompt_token_ids: (0..args.input_len)
                .map(|_| rng.random_range(3..32_000))
                .collect(),
            params: params.clone(),
            seed: i as u64,
            eos_token_ids: Arc::from(vec![2u32]),
            n: 1,
        };
        let admitted = sched.add_request(req, 0.0);
        anyhow::ensure!(matches!(admitted, Admission::Accepted), "{admitted:?}");
    }
    let clock = Instant::now();
    let (mut decode, mut mixed) = (Times::default(), Times::default());
    let (mut steps, mut generated) = (0usize, 0usize);
    while sched.has_unfinished() {
        let t0 = Instant::now();
        let out = sched.schedule(&mut kv, clock.elapsed().as_secs_f64());
        let scheduled = t0.elapsed().as_secs_f64() * 1e6;
        anyhow::ensure!(!out.is_empty(), "step {steps}: nothing scheduled");
        let sampled: Vec<SampledToken> = out
            .scheduled
            .iter()
            .filter(|s| s.sample)
            .map(|s| SampledToken {
                request_id: s.id,
                token: 7,
                logprob: -0.5,
            })
            .collect();
        generated += sampled.len();
        let step = StepOutput {
            sampled,
            ..Default::default()
        };
        let t1 = Instant::now();
        sched.update_from_output(&out, &step, &mut kv, clock.elapsed().as_secs_f64());
        let updated = t1.elapsed().as_secs_f64() * 1e6;
        let pure_decode = out.total_num_scheduled_tokens() == out.scheduled.len();
        let times = if pure_decode { &mut decode } else { &mut mixed };
        times.schedule.push(scheduled);
        times.update.push(updated);
        steps += 1;
    }
    anyhow::ensure!(
        generated == args.num_prompts * args.output_len,
        "generated {generated} tokens"
    );
    let batch = sc.max_num_seqs.min(args.num_prompts);
    let ([ds, du], [ms, mu]) = (decode.summary(), mixed.summary());
    println!(
        "scheduler host cost, {} requests x {}/{} tokens, max_num_seqs {}, policy {}, {steps} steps:",
        args.num_prompts,
        args.input_len,
        args.output_len,
        sc.max_num_seqs,
        sc.policy.as_str()
    );
    println!(
        "  decode steps ({}): schedule p50 {:.1} us (p99 {:.1}), update p50 {:.1} us (p99 {:.1}); {:.3} us a sequence",
        decode.schedule.len(),
        ds.0,
        ds.1,
        du.0,
        du.1,
        (ds.0 + du.0) / batch as f64
    );
    println!(
        "  steps with prefill ({}): schedule p50 {:.1} us, update p50 {:.1} us",
        mixed.schedule.len(),
        ms.0,
        mu.0
    );
    if args.json {
        println!(
            "{}",
            json!({
                "figure": "scheduler_host_us", "num_prompts": args.num_prompts,
                "input_len": args.input_len, "output_len": args.output_len,
                "max_num_seqs": sc.max_num_seqs, "policy": sc.policy.as_str(), "steps": steps,
                "decode_steps": decode.schedule.len(),
                "decode_schedule_us_p50": ds.0, "decode_schedule_us_p99": ds.1,
                "decode_update_us_p50": du.0, "decode_update_us_p99": du.1,
                "prefill_steps": mixed.schedule.len(),
                "prefill_schedule_us_p50": ms.0, "prefill_update_us_p50": mu.0,
            })
        );
    }
    Ok(())
}
