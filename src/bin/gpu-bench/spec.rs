//! `gpu-bench spec`: speculative decoding on the CUDA executor (issue 12).
//!
//! (a) `verify_ms`: the cost of a step that verifies k drafts per sequence (k + 1 positions:
//!     eager, attention for the k + 1 queries, lm_head and sampling over those rows) against
//!     the plain decode step (k = 0: the decode kernel, from a CUDA graph), at batch 1/8/32,
//!     k = 0..=5, every sequence at context `--ctx`. Hand-built batches through
//!     `execute_batch` (drafts verified as point masses): ms per step, median of `--iters`.
//!     Five variants split the cost (`VERIFY_VARIANTS`, `--variants` picks): the default (the
//!     verification's k + 1 queries as a flash prefill tile), `eager` (no graphs: its k = 0
//!     against the default's is the price of eager launches), `cublas` (no gemv: the linear
//!     layers at k + 1 rows), `no-attention` (attention skipped: the linear layers, norms,
//!     lm_head and sampling) and `verify-graphs` (verification steps replayed from CUDA graphs,
//!     `CudaBackendOptions::verify_graphs`; its k > 0 against the default's is what graphs
//!     save).
//! (b) `single_stream`: one request (`--input-len` random prompt, `--output-len` greedy tokens,
//!     ignore_eos) through brook's scheduler with adaptive depth on (`--fixed-depth`: every
//!     decode gets k drafts), against speculation off. Target `--model` and draft `--draft`
//!     (random weights, the same vocabulary) run for real — the draft's passes and K/V, the
//!     k + 1-row verification, the rollback of rejected K/V, adaptive depth reacting to what it
//!     sees — but each verification's outcome is forced (`CudaBackend::force_acceptance`,
//!     benchmarks only): each draft accepted with probability a from a seeded generator, the
//!     first rejected position emitting the target's own draw. Random weights accept almost
//!     nothing on their own, and a recorded greedy continuation does not help (bf16 rounding
//!     on the verify path differs from the decode path's, so it stops being the target's at
//!     the first near-tie: call g measured 0.00-0.17 at a = 0.5-0.9). Tokens/s for
//!     a ∈ {0.5, 0.7, 0.9} and max depth k ∈ 1..=5, with the expectation beside each row:
//!     Leviathan's E[tokens/step] = (1 - a^(k+1)) / (1 - a) for each verification at the depth
//!     it had, and the speedup that predicts from the measured ms per step against decode's.
//!     `--verify-graphs`: each depth runs twice, verification steps eager then from CUDA graphs
//!     (an A/B in one process; `verify_graphs` in each row).

use std::sync::Arc;
use std::time::Instant;

use brook::executor::backend::Backend;
use brook::executor::cuda::options::skip;
use brook::executor::cuda::{CudaBackend, CudaBackendOptions};
use brook::kv::KvCacheManager;
use brook::model::synthetic::synthetic_config;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use brook::spec::{SpecConfig, SpecMethod};
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
    /// (a)'s variants to run (comma-separated; default all). The first one's k = 0 is the
    /// decode step every row is compared with.
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
    /// (b): run each depth with verification steps eager and again from CUDA graphs.
    #[arg(long)]
    pub verify_graphs: bool,
}

/// (a) then (b); with `--fixed-depth` only (b), at fixed depth.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if !a.fixed_depth {
        verify_cost(&a.model, a.ctx, a.iters, &a.variants)?;
    }
    single_stream(a)
}

/// A variant of (a): its name and what it sets in the options.
type Variant = (&'static str, fn(&mut CudaBackendOptions));

/// The variants of (a): how a verification step's cost splits (each a fresh backend).
const VERIFY_VARIANTS: &[Variant] = &[
    // The default: the verification's queries as a flash prefill tile; decode from its graph.
    ("default", |_| {}),
    // No CUDA graphs: k = 0 is the eager decode, what a verification step pays for launches.
    ("eager", |o| o.cuda_graphs = false),
    // cuBLAS for every linear layer: whether brook's gemv at m = k + 1 <= 4 rows still beats
    // it (its sweep and defaults were measured at m = 1).
    ("cublas", |o| o.gemv_max_rows = 0),
    // Attention left out (output meaningless): what the rest of the step costs.
    ("no-attention", |o| o.skip = skip::ATTENTION),
    // Verification steps replayed from CUDA graphs (opt-in): the launches graphs save.
    ("verify-graphs", |o| o.verify_graphs = true),
];

/// (a): ms per step verifying k drafts per sequence, against plain decode (the default
/// variant's k = 0, from its graph), for each of `VERIFY_VARIANTS` named in `only` (all when
/// empty).
fn verify_cost(model: &str, ctx: usize, iters: usize, only: &[String]) -> anyhow::Result<()> {
    for name in only {
        anyhow::ensure!(
            VERIFY_VARIANTS.iter().any(|(v, _)| v == name),
            "unknown variant {name}; one of {:?}",
            VERIFY_VARIANTS.iter().map(|(v, _)| v).collect::<Vec<_>>()
        );
    }
    let mut decode_ms = std::collections::HashMap::new();
    let picked = VERIFY_VARIANTS
        .iter()
        .filter(|(v, _)| only.is_empty() || only.iter().any(|n| n == v));
    for &(variant, set) in picked {
        let mut opts = CudaBackendOptions {
            max_num_seqs: 32,
            max_num_batched_tokens: 4096.max(ctx),
            max_drafts: MAX_K,
            ..bench_options()
        };
        set(&mut opts);
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
                let base = *decode_ms.entry(batch).or_insert(med);
                eprintln!(
                    "{model} verify [{variant}] batch {batch} k {k} ctx {ctx}: {med:.3} ms/step ({:.2}x decode)",
                    med / base
                );
                emit(
                    json!({"figure": "spec_verify_ms", "model": model, "variant": variant,
                    "batch": batch, "k": k, "ctx": ctx, "median_ms": med, "vs_decode": med / base}),
                );
            }
        }
    }
    Ok(())
}

/// Leviathan et al.: expected tokens from one verification of k drafts, each accepted with
/// probability a independently, = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a).
fn expected_tokens(a: f64, k: usize) -> f64 {
    (0..=k).map(|i| a.powi(i as i32)).sum()
}

/// One finished request's figures, from its first token on (the prefill is the same with and
/// without drafts).
struct Stream {
    tokens: Vec<u32>,
    tokens_per_s: f64,
    /// Decode steps after the first token, and their mean wall time.
    steps: usize,
    ms_per_step: f64,
    drafts: u64,
    accepted: u64,
    /// Tokens those steps should give at the forced rate: `expected_tokens` of each
    /// verification at the depth it had, 1 for a step without drafts.
    expected: f64,
}

/// Runs request `id` (greedy, ignore_eos) alone to its end; `core` and `b` persist across calls
/// (the finished request is dropped from the backend by the next call's first step). `rate`:
/// the forced acceptance, for the expectation (None: speculation off).
fn stream(
    core: &mut Scheduler,
    kv: &mut KvCacheManager,
    b: &mut CudaBackend,
    id: u64,
    prompt: &[u32],
    output_len: usize,
    rate: Option<f64>,
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
    let (mut first, mut steps, mut expected) = (None, 0, 0.0);
    while core.has_unfinished() {
        let plan = core.schedule(kv, clock.elapsed().as_secs_f64());
        let step = execute(b, &plan)?;
        if first.is_some() && !plan.is_empty() {
            steps += 1;
            let depth = step.spec.drafts.iter().map(|d| d.proposed).next();
            expected += match (rate, depth) {
                (Some(a), Some(k)) => expected_tokens(a, k),
                _ => 1.0,
            };
        }
        for u in core.update_from_output(&plan, &step, kv, clock.elapsed().as_secs_f64()) {
            if !u.new_token_ids.is_empty() {
                first.get_or_insert_with(Instant::now);
            }
            tokens.extend(u.new_token_ids);
        }
    }
    let first = first.ok_or_else(|| anyhow::anyhow!("no token"))?;
    let secs = first.elapsed().as_secs_f64();
    let st = core.spec_stats();
    Ok(Stream {
        tokens_per_s: (tokens.len() - 1) as f64 / secs,
        tokens,
        steps,
        ms_per_step: secs * 1e3 / steps.max(1) as f64,
        drafts: st.num_draft_tokens - before.num_draft_tokens,
        accepted: st.num_accepted_tokens - before.num_accepted_tokens,
        expected,
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

/// (b): single-stream tokens/s at a forced acceptance rate, against speculation off.
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
    let mut b = backend(&a.model, opts.clone())?;
    let (mut core, mut kv) = scheduler(&b, SpecConfig::default());
    stream(&mut core, &mut kv, &mut b, 0, &prompt, 32, None)?;
    let off = stream(&mut core, &mut kv, &mut b, 1, &prompt, a.output_len, None)?;
    drop(b);
    eprintln!(
        "{} single stream, speculation off: {:.1} tokens/s, {:.3} ms/step",
        a.model, off.tokens_per_s, off.ms_per_step
    );
    emit(
        json!({"figure": "spec_single_stream", "model": a.model, "draft": a.draft,
        "method": "off", "tokens_per_s": off.tokens_per_s, "ms_per_step": off.ms_per_step,
        "input_len": a.input_len, "output_len": a.output_len}),
    );
    let graph_modes: &[bool] = match a.verify_graphs {
        true => &[false, true],
        false => &[false],
    };
    for (k, &verify_graphs) in (1..=MAX_K).flat_map(|k| graph_modes.iter().map(move |g| (k, g))) {
        let mut b = CudaBackend::synthetic_with_draft(
            synthetic_config(&a.model)?,
            synthetic_config(&a.draft)?,
            0,
            CudaBackendOptions {
                verify_graphs,
                ..opts.clone()
            },
        )?;
        let spec = SpecConfig {
            method: SpecMethod::Draft,
            max_depth: k,
            adaptive: !a.fixed_depth,
            ..SpecConfig::default()
        };
        let (mut core, mut kv) = scheduler(&b, spec);
        // Warm-up: graphs, cuBLAS heuristics and the scheduler's step-time fit.
        b.force_acceptance(Some((0.7, 100 + k as u64)))?;
        stream(&mut core, &mut kv, &mut b, 0, &prompt, 64, Some(0.7))?;
        for (i, rate) in [0.5f64, 0.7, 0.9].into_iter().enumerate() {
            b.force_acceptance(Some((rate, k as u64 * 10 + i as u64)))?;
            let t0 = Instant::now();
            let id = 1 + i as u64;
            let s = stream(
                &mut core,
                &mut kv,
                &mut b,
                id,
                &prompt,
                a.output_len,
                Some(rate),
            )?;
            let measured = s.accepted as f64 / s.drafts.max(1) as f64;
            let verifications = s.drafts as f64 / k as f64;
            // What the measured step costs and Leviathan's tokens per step predict.
            let made = (s.tokens.len() - 1) as f64;
            let per_step = made / s.steps.max(1) as f64;
            let want_per_step = s.expected / s.steps.max(1) as f64;
            let speedup = s.tokens_per_s / off.tokens_per_s;
            let predicted = want_per_step * off.ms_per_step / s.ms_per_step;
            let graphs = if verify_graphs { " verify-graphs" } else { "" };
            eprintln!(
                "{} + {}{graphs} k {k} a {rate}: {:.1} tokens/s ({speedup:.2}x off; expected \
                 {predicted:.2}x = {want_per_step:.2} tokens/step x {:.3} / {:.3} ms/step); \
                 {per_step:.2} tokens/step measured (E[k={k}] = {:.2}); acceptance {measured:.2} \
                 of {} drafts in {} steps (~{verifications:.0} at depth {k}), {:.0} ms",
                a.model,
                a.draft,
                s.tokens_per_s,
                off.ms_per_step,
                s.ms_per_step,
                expected_tokens(rate, k),
                s.drafts,
                s.steps,
                elapsed_ms(t0)
            );
            emit(
                json!({"figure": "spec_single_stream", "model": a.model, "draft": a.draft,
                "method": "draft", "max_depth": k, "adaptive": !a.fixed_depth, "accept_rate": rate,
                "verify_graphs": verify_graphs,
                "measured_acceptance": measured, "drafts": s.drafts, "steps": s.steps,
                "ms_per_step": s.ms_per_step, "decode_ms_per_step": off.ms_per_step,
                "tokens_per_step": per_step, "expected_tokens_per_step": want_per_step,
                "leviathan_tokens_per_step_at_k": expected_tokens(rate, k),
                "tokens_per_s": s.tokens_per_s, "speedup": speedup,
                "expected_speedup": predicted,
                "input_len": a.input_len, "output_len": a.output_len}),
            );
        }
    }
    Ok(())
}
