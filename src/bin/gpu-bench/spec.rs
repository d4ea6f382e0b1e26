//! `gpu-bench spec`: speculative decoding on the CUDA executor (issue 12).
//!
//! (a) `verify_ms`: the cost of a step that verifies k drafts per sequence (k + 1 positions:
//!     eager, flash prefill attention over the k + 1 queries, lm_head and sampling over those
//!     rows) against the plain decode step (k = 0: the decode kernel, from a CUDA graph), at
//!     batch 1/8/32, k = 0..=5, every sequence at context `--ctx`. Hand-built batches through
//!     `execute_batch` (drafts verified as point masses): ms per step, median of `--iters`.
//! (b) `single_stream`: one request (`--input-len` random prompt, `--output-len` greedy tokens,
//!     ignore_eos) through brook's scheduler with adaptive depth on, against speculation off.
//!     Target `--model` (random weights), draft `--draft` (random weights, the same
//!     vocabulary) run for its real cost — its passes, catch-up and K/V — but each proposal it
//!     makes is replaced, draft by draft, by the target's own greedy continuation (recorded in
//!     the plain run first) with probability a, else by a random token: the per-token
//!     acceptance rate is a by construction. Tokens/s for a ∈ {0.5, 0.7, 0.9} and max depth
//!     k ∈ 1..=5, with the acceptance actually measured (the continuation is the plain run's:
//!     a verification that computes a position on the prefill path may round differently from
//!     the decode kernel, and after such a divergence the recorded tokens are no longer the
//!     target's, so the measured rate is reported beside a).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use brook::executor::backend::Backend;
use brook::executor::cuda::{CudaBackend, CudaBackendOptions};
use brook::kv::KvCacheManager;
use brook::model::synthetic::synthetic_config;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use brook::spec::proposer::ProposeStats as Stats;
use brook::spec::{Proposal, ProposeRequest, Proposer, SpecConfig, SpecMethod};
use brook::step::{BatchInput, SampleInput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{backend, bench_options, elapsed_ms, emit, execute, median};

const MAX_K: usize = 5;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "llama-2-7b")]
    pub model: String,
    /// The draft model's synthetic shape (the target's vocabulary).
    #[arg(long, default_value = "tinyllama-1.1b")]
    pub draft: String,
    /// Context of every sequence in the verification-cost figure.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    #[arg(long, default_value_t = 256)]
    pub output_len: usize,
    /// Only (b), at the fixed depth k (every decode gets k drafts) instead of the adaptive
    /// depth.
    #[arg(long)]
    pub fixed_depth: bool,
}

/// (a) then (b); with `--fixed-depth` only (b), at fixed depth.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if !a.fixed_depth {
        verify_cost(&a.model, a.ctx, a.iters)?;
    }
    single_stream(a)
}

/// (a): ms per step verifying k drafts per sequence, against plain decode.
fn verify_cost(model: &str, ctx: usize, iters: usize) -> anyhow::Result<()> {
    let opts = CudaBackendOptions {
        max_num_seqs: 32,
        max_num_batched_tokens: 4096.max(ctx),
        max_drafts: MAX_K,
        ..bench_options()
    };
    let mut b = backend(model, opts)?;
    let bs = b.info().block_size;
    let vocab = b.config().vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let greedy = |index| {
        Some(SampleInput {
            params: Arc::new(SamplingParams::greedy(1 << 20)),
            seed: 0,
            output_index: index,
        })
    };
    let per_seq = (ctx + MAX_K + 1).div_ceil(bs);
    for batch in [1usize, 8, 32] {
        let tables: Vec<Vec<u32>> = (0..batch)
            .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
            .collect();
        // Each sequence's context computed once (its K/V real numbers, not stale memory).
        for (i, t) in tables.iter().enumerate() {
            let prompt: Vec<u32> = (0..ctx).map(|_| rng.random_range(0..vocab)).collect();
            let mut p = BatchInput::default();
            p.push_seq(RequestId(i as u64), &prompt, 0, t, bs, greedy(0));
            b.execute_batch(&p)?;
        }
        let mut base_ms = None;
        for k in 0..=MAX_K {
            let mut step = BatchInput::default();
            for (i, t) in tables.iter().enumerate() {
                let q: Vec<u32> = (0..=k).map(|_| rng.random_range(0..vocab)).collect();
                step.push_seq(RequestId(i as u64), &q, ctx, t, bs, greedy(1));
                step.seqs.last_mut().expect("pushed").num_drafts = k;
            }
            for _ in 0..3 {
                b.execute_batch(&step)?;
            }
            let ms: Vec<f64> = (0..iters)
                .map(|_| {
                    let t0 = Instant::now();
                    b.execute_batch(&step).map(|_| elapsed_ms(t0))
                })
                .collect::<anyhow::Result<_>>()?;
            let med = median(ms);
            let base = *base_ms.get_or_insert(med);
            eprintln!(
                "{model} verify batch {batch} k {k} ctx {ctx}: {med:.3} ms/step ({:.2}x decode)",
                med / base
            );
            emit(
                json!({"figure": "spec_verify_ms", "model": model, "batch": batch, "k": k,
                "ctx": ctx, "median_ms": med, "vs_decode": med / base}),
            );
        }
    }
    Ok(())
}

/// A real draft model's proposals, replaced draft by draft by the target's greedy continuation
/// with probability `accept` (f32 bits), else by a random token.
struct Controlled {
    inner: Box<dyn Proposer>,
    greedy: Arc<Vec<u32>>,
    accept: Arc<AtomicU32>,
    rng: ChaCha8Rng,
    vocab: u32,
}

impl Proposer for Controlled {
    fn propose(&mut self, reqs: &[ProposeRequest], out: &mut Vec<Proposal>) -> Result<Stats> {
        let stats = self.inner.propose(reqs, out)?;
        let a = f32::from_bits(self.accept.load(Ordering::Relaxed));
        for (r, p) in reqs.iter().zip(out.iter_mut()) {
            for (j, t) in p.tokens.iter_mut().enumerate() {
                let right = self.greedy.get(r.output_index + j).copied();
                *t = match right {
                    Some(w) if self.rng.random::<f32>() < a => w,
                    _ => self.rng.random_range(0..self.vocab),
                };
            }
        }
        Ok(stats)
    }

    fn forget(&mut self, id: RequestId) {
        self.inner.forget(id);
    }
}

/// One finished request's figures.
struct Stream {
    tokens: Vec<u32>,
    tokens_per_s: f64,
    drafts: u64,
    accepted: u64,
}

/// Runs request `id` (greedy, ignore_eos) alone to its end; `core` and `b` persist across calls
/// (the finished request is dropped from the backend by the next call's first step).
fn stream(
    core: &mut Scheduler,
    kv: &mut KvCacheManager,
    b: &mut CudaBackend,
    id: u64,
    prompt: &[u32],
    output_len: usize,
) -> anyhow::Result<Stream> {
    let before = core.spec_stats().clone();
    let clock = Instant::now();
    let req = NewRequest {
        id: RequestId(id),
        prompt_token_ids: prompt.to_vec(),
        params: Arc::new(SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(output_len)
        }),
        seed: id,
        eos_token_ids: Arc::from(vec![2u32]),
        n: 1,
    };
    let t = clock.elapsed().as_secs_f64();
    anyhow::ensure!(
        matches!(core.add_request(req, t), Admission::Accepted),
        "request refused"
    );
    let mut tokens = Vec::with_capacity(output_len);
    let mut first = None;
    while core.has_unfinished() {
        let plan = core.schedule(kv, clock.elapsed().as_secs_f64());
        let step = execute(b, &plan)?;
        for u in core.update_from_output(&plan, &step, kv, clock.elapsed().as_secs_f64()) {
            if !u.new_token_ids.is_empty() {
                first.get_or_insert_with(Instant::now);
            }
            tokens.extend(u.new_token_ids);
        }
    }
    // Decode speed: from the first token (the prefill is the same with and without drafts).
    let first = first.ok_or_else(|| anyhow::anyhow!("no token"))?;
    let secs = first.elapsed().as_secs_f64();
    let st = core.spec_stats();
    Ok(Stream {
        tokens_per_s: (tokens.len() - 1) as f64 / secs,
        tokens,
        drafts: st.num_draft_tokens - before.num_draft_tokens,
        accepted: st.num_accepted_tokens - before.num_accepted_tokens,
    })
}

fn scheduler(b: &CudaBackend, spec: SpecConfig) -> (Scheduler, KvCacheManager) {
    let info = b.info();
    let kv = KvCacheManager::new(info.num_kv_blocks, info.block_size, true);
    let core = Scheduler::new(SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 4096,
        max_model_len: b.config().max_position_embeddings,
        long_prefill_token_threshold: 0,
        ..Default::default()
    })
    .with_speculation(spec);
    (core, kv)
}

/// (b): single-stream tokens/s with a controlled acceptance rate, against speculation off.
fn single_stream(a: &Args) -> anyhow::Result<()> {
    let opts = CudaBackendOptions {
        max_num_seqs: 8,
        max_num_batched_tokens: 4096,
        max_drafts: MAX_K,
        ..bench_options()
    };
    let vocab = synthetic_config(&a.model)?.vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let prompt: Vec<u32> = (0..a.input_len)
        .map(|_| rng.random_range(0..vocab))
        .collect();
    // Speculation off: the baseline, and the continuation the controlled drafts use.
    let mut b = backend(&a.model, opts.clone())?;
    let (mut core, mut kv) = scheduler(&b, SpecConfig::default());
    stream(&mut core, &mut kv, &mut b, 0, &prompt, 32)?;
    let off = stream(&mut core, &mut kv, &mut b, 1, &prompt, a.output_len)?;
    drop(b);
    eprintln!(
        "{} single stream, speculation off: {:.1} tokens/s",
        a.model, off.tokens_per_s
    );
    emit(
        json!({"figure": "spec_single_stream", "model": a.model, "draft": a.draft,
        "method": "off", "tokens_per_s": off.tokens_per_s, "input_len": a.input_len,
        "output_len": a.output_len}),
    );
    let greedy = Arc::new(off.tokens.clone());
    for k in 1..=MAX_K {
        let accept = Arc::new(AtomicU32::new(0.7f32.to_bits()));
        let mut b = CudaBackend::synthetic_with_draft(
            synthetic_config(&a.model)?,
            synthetic_config(&a.draft)?,
            0,
            opts.clone(),
        )?;
        let (g, acc) = (greedy.clone(), accept.clone());
        b.map_proposer(move |inner| {
            let inner = inner.expect("a draft model");
            let p: Box<dyn Proposer> = Box::new(Controlled {
                inner,
                greedy: g,
                accept: acc,
                rng: ChaCha8Rng::seed_from_u64(k as u64),
                vocab,
            });
            Some(p)
        });
        let spec = SpecConfig {
            method: SpecMethod::Draft,
            max_depth: k,
            adaptive: !a.fixed_depth,
            ..SpecConfig::default()
        };
        let (mut core, mut kv) = scheduler(&b, spec);
        // Warm-up: graphs, cuBLAS heuristics and the scheduler's step-time fit.
        stream(&mut core, &mut kv, &mut b, 0, &prompt, 64)?;
        for (i, rate) in [0.5f32, 0.7, 0.9].into_iter().enumerate() {
            accept.store(rate.to_bits(), Ordering::Relaxed);
            let t0 = Instant::now();
            let s = stream(
                &mut core,
                &mut kv,
                &mut b,
                1 + i as u64,
                &prompt,
                a.output_len,
            )?;
            let diverged = s.tokens.iter().zip(&off.tokens).position(|(x, y)| x != y);
            let measured = s.accepted as f64 / s.drafts.max(1) as f64;
            eprintln!(
                "{} + {} k {k} a {rate}: {:.1} tokens/s ({:.2}x off), acceptance measured {measured:.2} of {} drafts, {:.0} ms",
                a.model,
                a.draft,
                s.tokens_per_s,
                s.tokens_per_s / off.tokens_per_s,
                s.drafts,
                elapsed_ms(t0)
            );
            emit(
                json!({"figure": "spec_single_stream", "model": a.model, "draft": a.draft,
                "method": "draft", "max_depth": k, "adaptive": !a.fixed_depth, "accept_rate": rate,
                "measured_acceptance": measured, "drafts": s.drafts,
                "tokens_per_s": s.tokens_per_s, "speedup": s.tokens_per_s / off.tokens_per_s,
                "diverged_at": diverged, "input_len": a.input_len, "output_len": a.output_len}),
            );
        }
    }
    Ok(())
}
