//! The discrete-event loop: the real `Scheduler` and `KvCacheManager` on simulated time.
//!
//! Time advances by executor steps; arrivals that fall inside a step are handed to the
//! scheduler (with their own arrival time) before the next `schedule`, as the actor's mailbox
//! would. When nothing is runnable the clock jumps to the next arrival.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::kv::KvCacheManager;
use crate::request::RequestId;
use crate::sampling::params::SamplingParams;
use crate::scheduler::{
    Admission, NewRequest, Policy, RequestClass, RequestUpdate, Scheduler, SchedulerStats,
};
use crate::simulate::executor::{CostModelExecutor, EOS};
use crate::simulate::lookahead::{LookaheadReport, LookaheadSetup};
use crate::simulate::workload::{SimRequest, Workload};
use crate::step::StepOutput;

/// How long after the last arrival the run may drain before what is left counts as missed.
const DRAIN_LIMIT_S: f64 = 600.0;
/// Idle clock advance when a step plans nothing and no arrival is due (e.g. everything paused).
const IDLE_TICK_S: f64 = 0.01;

/// What happened to one request.
#[derive(Debug, Clone, Default)]
pub struct RequestRecord {
    pub class: Option<RequestClass>,
    pub prompt_tokens: usize,
    pub arrival_s: f64,
    pub rejected: bool,
    pub first_token_s: Option<f64>,
    pub last_token_s: Option<f64>,
    pub output_tokens: usize,
    pub finished_s: Option<f64>,
    /// Gaps between consecutive output tokens, seconds.
    pub itl_s: Vec<f64>,
}

impl RequestRecord {
    pub fn ttft_s(&self) -> Option<f64> {
        self.first_token_s.map(|t| t - self.arrival_s)
    }

    /// Mean inter-token latency (time per output token after the first); None with < 2 tokens.
    pub fn mean_itl_s(&self) -> Option<f64> {
        match (self.first_token_s, self.last_token_s) {
            (Some(f), Some(l)) if self.output_tokens >= 2 => {
                Some((l - f) / (self.output_tokens - 1) as f64)
            }
            _ => None,
        }
    }
}

/// One simulated run.
#[derive(Debug, Clone)]
pub struct SimRun {
    pub policy: Policy,
    pub rate: f64,
    pub records: Vec<RequestRecord>,
    /// Simulated seconds until the last request finished (or the drain limit).
    pub makespan_s: f64,
    pub steps: u64,
    pub stats: SchedulerStats,
    pub fitted_cost: crate::scheduler::CostCoefficients,
    /// Lookahead decode's figures, when modelled.
    pub lookahead: Option<LookaheadReport>,
}

/// One run of `policy` at `rate`; with `lookahead`, lookahead decode modelled
/// (`simulate::lookahead`).
pub fn run_once(
    w: &Workload,
    policy: Policy,
    rate: f64,
    lookahead: Option<LookaheadSetup>,
) -> anyhow::Result<SimRun> {
    let reqs = w.requests(rate)?;
    // A report over no requests would read as every SLO met.
    anyhow::ensure!(
        !reqs.is_empty(),
        "no request arrives in {} s at {rate} req/s: lengthen the duration or raise the rate",
        w.duration_s
    );
    let mut cfg = w.scheduler.clone();
    cfg.policy = policy;
    cfg.slo = w.slo;
    cfg.validate().map_err(anyhow::Error::msg)?;
    let mut sched = Scheduler::new(cfg);
    let e = &w.engine;
    let mut kv = KvCacheManager::new(e.num_kv_blocks, e.block_size, e.enable_prefix_caching);
    let max_len = match w.scheduler.max_model_len {
        0 => e.num_kv_blocks * e.block_size,
        n => n.min(e.num_kv_blocks * e.block_size),
    };
    let mut exec = CostModelExecutor::new(
        e.cost,
        e.noise,
        e.prefill_attn_min_query,
        w.seed ^ 0xe8ec,
        e.block_size,
        e.num_kv_blocks,
        max_len,
    );
    if let Some(setup) = lookahead {
        exec = exec.with_lookahead(setup, e.block_size, max_len);
    }
    let mut token_rng = ChaCha8Rng::seed_from_u64(w.seed ^ 0x70c3);
    let eos: Arc<[u32]> = Arc::from(vec![EOS]);
    let mut records: Vec<RequestRecord> = reqs
        .iter()
        .map(|r| RequestRecord {
            prompt_tokens: r.prompt_tokens,
            arrival_s: r.arrival_s,
            ..RequestRecord::default()
        })
        .collect();
    let last_arrival = reqs.last().map_or(0.0, |r| r.arrival_s);
    let (mut t, mut next, mut steps) = (0.0f64, 0usize, 0u64);
    loop {
        while next < reqs.len() && reqs[next].arrival_s <= t {
            let r = &reqs[next];
            let new = new_request(next as u64, r, &mut token_rng, eos.clone());
            records[next].class = Some(sched.classify(r.prompt_tokens));
            match sched.add_request(new, r.arrival_s) {
                Admission::Accepted => {}
                Admission::Overloaded { .. } => records[next].rejected = true,
                Admission::Duplicate => anyhow::bail!("duplicate request id {next}"),
            }
            next += 1;
        }
        if !sched.has_unfinished() {
            if next == reqs.len() {
                break;
            }
            t = t.max(reqs[next].arrival_s);
            continue;
        }
        if t > last_arrival + DRAIN_LIMIT_S {
            break;
        }
        let plan = sched.schedule(&mut kv, t);
        if plan.is_empty() {
            let updates = sched.update_from_output(&plan, &StepOutput::default(), &mut kv, t);
            apply(&mut records, &updates, t);
            if updates.is_empty() {
                t = match reqs.get(next) {
                    Some(r) => r.arrival_s.max(t + IDLE_TICK_S),
                    None => t + IDLE_TICK_S,
                };
            }
            continue;
        }
        let dt = exec.step_time(&plan);
        let (step, elapsed) = exec.execute(&plan, t, dt, |id| reqs[id as usize].output_tokens)?;
        t += elapsed;
        steps += 1;
        let updates = sched.update_from_output(&plan, &step, &mut kv, t);
        apply(&mut records, &updates, t);
    }
    Ok(SimRun {
        policy,
        rate,
        records,
        makespan_s: t,
        steps,
        stats: sched.stats().clone(),
        fitted_cost: sched.cost_model().coefficients(),
        lookahead: exec.lookahead_report(),
    })
}

fn new_request(id: u64, r: &SimRequest, rng: &mut ChaCha8Rng, eos: Arc<[u32]>) -> NewRequest {
    NewRequest {
        n: 1,
        id: RequestId(id),
        // Random ids: prompts share no prefix, so the prefix cache only helps resumes.
        prompt_token_ids: (0..r.prompt_tokens)
            .map(|_| rng.random_range(100..32_000))
            .collect(),
        params: Arc::new(SamplingParams::greedy(r.max_tokens)),
        seed: id,
        eos_token_ids: eos,
    }
}

fn apply(records: &mut [RequestRecord], updates: &[RequestUpdate], t: f64) {
    for u in updates {
        let rec = &mut records[u.id.0 as usize];
        let n = u.new_token_ids.len();
        if n > 0 {
            if let Some(last) = rec.last_token_s {
                let gap = (t - last) / n as f64;
                rec.itl_s.extend(std::iter::repeat_n(gap, n));
            }
            rec.first_token_s.get_or_insert(t);
            rec.last_token_s = Some(t);
            rec.output_tokens += n;
        }
        if u.finished.is_some() {
            rec.finished_s = Some(t);
        }
    }
}
