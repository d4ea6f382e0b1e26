//! The paged, batched CPU engine against the plain forward (`model::reference`) of the same
//! weights. Batches are built by hand, as the scheduler would: sequences arrive at different
//! steps, prompts are prefilled in chunks that do not align with blocks, decodes share batches
//! with other sequences' prefill chunks, block tables are random and non-contiguous, and freed
//! blocks (holding stale K/V) are reused.
//!
//! (Over 600 lines: every case shares the batch builders and the reference check above; split
//! by topic when it grows further.)

use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::sampling::sampler::Sampler;

use super::*;
use crate::model::config::Architecture;
use crate::model::reference::reference_greedy;
use crate::model::testing::{write_test_model, RopeStyle, TestModelSpec};
use crate::request::RequestId;
use crate::sampling::params::SamplingParams;
use crate::sampling::sampler::argmax;
use crate::step::SampleInput;

const TOLERANCE: f32 = 1e-4;

/// How the engine is driven; each test overrides one knob.
#[derive(Debug, Clone)]
struct Scenario {
    prompt_lens: Vec<usize>,
    /// Step at which each prompt arrives.
    arrivals: Vec<usize>,
    /// Prefill chunk sizes, cycled per sequence.
    chunk_sizes: Vec<usize>,
    /// Tokens per step: decodes first, the rest to prompt chunks (as the scheduler does).
    token_budget: usize,
    decode_steps: usize,
    block_size: usize,
    num_blocks: usize,
    seed: u64,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            // The last prompt arrives after others finished, so it reuses their (stale) blocks.
            prompt_lens: vec![3, 17, 40, 65, 29],
            arrivals: vec![0, 0, 2, 3, 20],
            chunk_sizes: vec![7, 5, 11, 13],
            token_budget: 24,
            decode_steps: 6,
            block_size: 16,
            num_blocks: 14,
            seed: 0,
        }
    }
}

/// Hands out block ids in random order; freed blocks go back and are reshuffled.
struct BlockAllocator {
    free: Vec<u32>,
    rng: ChaCha8Rng,
    released: std::collections::HashSet<u32>,
    /// Allocations of a block that an earlier sequence had used.
    reused: usize,
}

impl BlockAllocator {
    fn new(num_blocks: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb10c);
        let mut free: Vec<u32> = (0..num_blocks as u32).collect();
        free.shuffle(&mut rng);
        BlockAllocator {
            free,
            rng,
            released: Default::default(),
            reused: 0,
        }
    }

    fn alloc(&mut self) -> u32 {
        let block = self.free.pop().expect("test scenario ran out of KV blocks");
        self.reused += self.released.contains(&block) as usize;
        block
    }

    fn release(&mut self, blocks: Vec<u32>) {
        self.released.extend(&blocks);
        self.free.extend(blocks);
        self.free.shuffle(&mut self.rng);
    }
}

struct SeqState {
    id: RequestId,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    /// The logits row each generated token came from.
    logits: Vec<Vec<f32>>,
    /// Tokens whose K/V is in the cache.
    computed: usize,
    blocks: Vec<u32>,
    chunks_done: usize,
    arrival: usize,
    done: bool,
}

impl SeqState {
    fn token(&self, pos: usize) -> u32 {
        if pos < self.prompt.len() {
            self.prompt[pos]
        } else {
            self.generated[pos - self.prompt.len()]
        }
    }

    fn known(&self) -> usize {
        self.prompt.len() + self.generated.len()
    }
}

fn write_model(spec: &TestModelSpec) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), spec).unwrap();
    dir
}

fn backend_for(dir: &Path, block_size: usize, num_blocks: usize) -> CpuBackend {
    backend_for_tp(dir, block_size, num_blocks, 1)
}

/// `backend_for` with the model split over `tp` ranks (each rank's pool `num_blocks` blocks).
fn backend_for_tp(dir: &Path, block_size: usize, num_blocks: usize, tp: usize) -> CpuBackend {
    let config = ModelConfig::from_dir(dir).unwrap();
    let rank = crate::model::shard::shard_config(&config, tp);
    let opts = CpuBackendOptions {
        block_size,
        kv_cache_bytes: num_blocks * KvPool::bytes_per_block(&rank, block_size),
        num_threads: Some(2),
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
        tensor_parallel_size: tp,
    };
    CpuBackend::load(dir, opts).unwrap()
}

/// Runs the scenario through the backend with greedy sampling; returns every sequence's state.
fn run_engine(backend: &mut CpuBackend, sc: &Scenario) -> Vec<SeqState> {
    let vocab = backend.config().vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(sc.seed);
    let mut blocks = BlockAllocator::new(sc.num_blocks, sc.seed);
    let mut seqs: Vec<SeqState> = sc
        .prompt_lens
        .iter()
        .zip(&sc.arrivals)
        .enumerate()
        .map(|(i, (&len, &arrival))| SeqState {
            id: RequestId(100 + i as u64),
            prompt: (0..len).map(|_| rng.random_range(0..vocab)).collect(),
            generated: vec![],
            logits: vec![],
            computed: 0,
            blocks: vec![],
            chunks_done: 0,
            arrival,
            done: false,
        })
        .collect();
    let greedy = Arc::new(SamplingParams::greedy(sc.decode_steps));
    let bs = sc.block_size;
    let mut mixed_steps = 0;
    for step in 0.. {
        if seqs.iter().all(|s| s.done) {
            break;
        }
        assert!(step < 1000, "scenario does not finish");
        let active = |s: &SeqState| s.arrival <= step && !s.done;
        let mut budget = sc.token_budget;
        let mut plan: Vec<(usize, usize)> = vec![];
        for (i, s) in seqs.iter().enumerate() {
            if active(s) && s.computed == s.known() - 1 && !s.generated.is_empty() && budget > 0 {
                plan.push((i, 1));
                budget -= 1;
            }
        }
        for (i, s) in seqs.iter_mut().enumerate() {
            if active(s) && s.computed < s.prompt.len() {
                let want = sc.chunk_sizes[(i + s.chunks_done) % sc.chunk_sizes.len()];
                let q = want.min(budget).min(s.prompt.len() - s.computed);
                if q > 0 {
                    plan.push((i, q));
                    budget -= q;
                    s.chunks_done += 1;
                }
            }
        }
        if plan.is_empty() {
            continue;
        }
        // The backend must not depend on the order of sequences in the batch.
        plan.shuffle(&mut rng);
        let mut batch = BatchInput::default();
        for &(i, q) in &plan {
            let s = &mut seqs[i];
            let context_len = s.computed + q;
            while s.blocks.len() * bs < context_len {
                s.blocks.push(blocks.alloc());
            }
            let tokens: Vec<u32> = (s.computed..context_len).map(|p| s.token(p)).collect();
            let sample = (context_len == s.known()).then(|| SampleInput {
                params: greedy.clone(),
                seed: 7,
                output_index: s.generated.len(),
            });
            batch.push_seq(s.id, &tokens, s.computed, &s.blocks, bs, sample);
        }
        if batch.num_decode_seqs() > 0 && batch.num_prefill_tokens() > 0 {
            mixed_steps += 1;
        }
        let logits = backend.forward_logits(&batch).unwrap();
        assert_eq!(logits.len(), batch.num_sampled());
        // The sampling path on the same batch (it rewrites identical K/V) picks the argmax tokens.
        let out = backend.execute_batch(&batch).unwrap();
        assert_eq!(out.sampled.len(), logits.len());
        let mut rows = logits.into_iter().zip(out.sampled);
        for (seq_input, &(i, q)) in batch.seqs.iter().zip(&plan) {
            let s = &mut seqs[i];
            s.computed += q;
            if seq_input.sample.is_none() {
                continue;
            }
            let (row, sampled) = rows.next().unwrap();
            let token = argmax(&row).0;
            assert_eq!((sampled.request_id, sampled.token), (s.id, token));
            s.generated.push(token);
            s.logits.push(row);
            if s.generated.len() == sc.decode_steps {
                s.done = true;
                blocks.release(std::mem::take(&mut s.blocks));
            }
        }
    }
    assert!(mixed_steps > 0, "no step mixed decodes with prefill chunks");
    assert!(blocks.reused > 0, "no block was reused");
    seqs
}

/// The key equality: every sampled logits row within `TOLERANCE` of the reference's, and the same
/// greedy tokens, for every sequence of the scenario.
fn assert_engine_matches_reference(spec: &TestModelSpec, sc: &Scenario) {
    assert_matches_reference_tp(spec, sc, 1);
}

/// `assert_engine_matches_reference` with the engine's model split over `tp` ranks.
fn assert_matches_reference_tp(spec: &TestModelSpec, sc: &Scenario, tp: usize) {
    let dir = write_model(spec);
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let weights = load_weights(dir.path(), &config, false).unwrap();
    let mut backend = backend_for_tp(dir.path(), sc.block_size, sc.num_blocks, tp);
    assert_eq!(backend.info().num_kv_blocks, sc.num_blocks);
    let seqs = run_engine(&mut backend, sc);
    let mut worst = 0f32;
    for s in &seqs {
        let (tokens, rows) =
            reference_greedy(&config, &weights, &s.prompt, sc.decode_steps).unwrap();
        for (step, (engine, reference)) in s.logits.iter().zip(&rows).enumerate() {
            assert_eq!(engine.len(), reference.len());
            for (a, b) in engine.iter().zip(reference) {
                let d = (a - b).abs();
                assert!(
                    d <= TOLERANCE,
                    "{} (prompt {}) step {step}: |{a} - {b}| = {d}",
                    s.id,
                    s.prompt.len()
                );
                worst = worst.max(d);
            }
        }
        assert_eq!(s.generated, tokens, "{} (prompt {})", s.id, s.prompt.len());
    }
    eprintln!("max |engine - reference| logit difference: {worst:e}");
}

#[test]
fn paged_engine_matches_reference_gqa() {
    assert_engine_matches_reference(&TestModelSpec::default(), &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_mha() {
    assert_engine_matches_reference(&TestModelSpec::default().heads(4, 4), &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_mqa() {
    assert_engine_matches_reference(&TestModelSpec::default().heads(4, 1), &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_tied_embeddings() {
    assert_engine_matches_reference(&TestModelSpec::default().tied(true), &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_llama3_rope() {
    assert_engine_matches_reference(
        &TestModelSpec::default().llama3_rope(true),
        &Scenario::default(),
    );
}

#[test]
fn paged_engine_matches_reference_rope_parameters_block() {
    let spec = TestModelSpec::default()
        .rope_style(RopeStyle::Parameters)
        .llama3_rope(true);
    assert_engine_matches_reference(&spec, &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_attention_bias() {
    assert_engine_matches_reference(
        &TestModelSpec::default().attention_bias(true),
        &Scenario::default(),
    );
}

#[test]
fn paged_engine_matches_reference_explicit_head_dim() {
    // 4 heads of 32 on a hidden size of 64: q_dim 128 differs from hidden_size.
    assert_engine_matches_reference(&TestModelSpec::default().head_dim(32), &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_mistral() {
    let spec = TestModelSpec::default().architecture(Architecture::Mistral);
    assert_engine_matches_reference(&spec, &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_mistral_sliding_window() {
    // Prompts of up to 65 tokens against a window of 12: most queries see part of their context.
    let spec = TestModelSpec::default()
        .architecture(Architecture::Mistral)
        .sliding_window(Some(12));
    assert_engine_matches_reference(&spec, &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_qwen2_qkv_bias() {
    let spec = TestModelSpec::default()
        .architecture(Architecture::Qwen2)
        .tied(true);
    assert_engine_matches_reference(&spec, &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_qwen3_qk_norm() {
    let spec = TestModelSpec::default()
        .architecture(Architecture::Qwen3)
        .heads(6, 2)
        .head_dim(24);
    assert_engine_matches_reference(&spec, &Scenario::default());
}

#[test]
fn paged_engine_matches_reference_phi3_fused_with_window() {
    let spec = TestModelSpec::default()
        .architecture(Architecture::Phi3)
        .sliding_window(Some(20));
    assert_engine_matches_reference(&spec, &Scenario::default());
}

#[test]
fn freed_blocks_behind_the_window_are_accepted_only_there() {
    let dir = write_model(
        &TestModelSpec::default()
            .architecture(Architecture::Mistral)
            .sliding_window(Some(8)),
    );
    let mut backend = backend_for(dir.path(), 4, 16);
    let prompt: Vec<u32> = (0..12).map(|i| (i * 31 + 5) % 300).collect();
    let table = vec![3, 9, 1, 7];
    let first = one_seq_batch(1, &prompt, 0, table.clone(), 4, None);
    backend.forward_logits(&first).unwrap();
    // Position 12 sees 5..=12: block 0 (0..4) may be freed, block 1 (4..8) may not.
    let mut freed = table.clone();
    freed[0] = crate::step::NULL_BLOCK;
    let ok = one_seq_batch(1, &[42], 12, freed.clone(), 4, greedy_sample());
    let reference = one_seq_batch(1, &[42], 12, table, 4, greedy_sample());
    assert_eq!(
        backend.forward_logits(&ok).unwrap(),
        backend.forward_logits(&reference).unwrap()
    );
    freed[1] = crate::step::NULL_BLOCK;
    let bad = one_seq_batch(1, &[42], 12, freed, 4, greedy_sample());
    let err = backend.forward_logits(&bad).unwrap_err().to_string();
    assert!(err.contains("freed block 1"), "{err}");
    // Without a window no block may be freed.
    let dir = write_model(&TestModelSpec::default());
    let mut full = backend_for(dir.path(), 4, 16);
    let mut t = vec![3, 9, 1, 7];
    t[0] = crate::step::NULL_BLOCK;
    let err = full
        .forward_logits(&one_seq_batch(1, &[42], 12, t, 4, greedy_sample()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("freed block 0"), "{err}");
}

#[test]
fn paged_engine_matches_reference_odd_block_size() {
    let sc = Scenario {
        block_size: 5,
        num_blocks: 36,
        ..Scenario::default()
    };
    assert_engine_matches_reference(&TestModelSpec::default(), &sc);
}

#[test]
fn paged_engine_matches_reference_with_a_small_token_budget() {
    // Chunks cut by the budget: a prompt's prefill spreads over many steps beside decodes.
    let sc = Scenario {
        token_budget: 9,
        ..Scenario::default()
    };
    assert_engine_matches_reference(&TestModelSpec::default(), &sc);
}

fn one_seq_batch(
    id: u64,
    tokens: &[u32],
    first_pos: usize,
    block_table: Vec<u32>,
    bs: usize,
    sample: Option<SampleInput>,
) -> BatchInput {
    let mut b = BatchInput::default();
    b.push_seq(RequestId(id), tokens, first_pos, &block_table, bs, sample);
    b
}

fn greedy_sample() -> Option<SampleInput> {
    Some(SampleInput {
        params: Arc::new(SamplingParams::greedy(4)),
        seed: 1,
        output_index: 0,
    })
}

#[test]
fn reading_an_unwritten_kv_slot_gives_nan_logits() {
    let dir = write_model(&TestModelSpec::default());
    let mut backend = backend_for(dir.path(), 16, 8);
    // A decode at position 4 whose positions 0..4 were never written.
    let batch = one_seq_batch(1, &[42], 4, vec![3], 16, greedy_sample());
    let logits = backend.forward_logits(&batch).unwrap();
    assert!(logits[0].iter().all(|x| x.is_nan()));
    // The same token as a proper one-token prompt is finite.
    let ok = one_seq_batch(2, &[42], 0, vec![5], 16, greedy_sample());
    assert!(backend.forward_logits(&ok).unwrap()[0]
        .iter()
        .all(|x| x.is_finite()));
}

#[test]
fn execute_samples_only_sequences_that_ask_and_seeds_reproduce() {
    let dir = write_model(&TestModelSpec::default());
    let mut backend = backend_for(dir.path(), 16, 8);
    let params = Arc::new(SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    });
    let sample = |seed| {
        Some(SampleInput {
            params: params.clone(),
            seed,
            output_index: 0,
        })
    };
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 300).collect();
    let chunk = one_seq_batch(9, &prompt[..12], 0, vec![2, 6], 16, None);
    let out = backend.execute_batch(&chunk).unwrap();
    assert!(out.sampled.is_empty());
    let rest = one_seq_batch(9, &prompt[12..], 12, vec![2, 6], 16, sample(5));
    let logits = backend.forward_logits(&rest).unwrap();
    let a = backend.execute_batch(&rest).unwrap();
    let b = backend.execute_batch(&rest).unwrap();
    assert_eq!(a.sampled.len(), 1);
    assert_eq!(a.sampled[0].request_id, RequestId(9));
    assert_eq!(a.sampled[0].token, b.sampled[0].token);
    let direct = Sampler::new().sample(&logits[0], &params, 5, 0, None);
    assert_eq!(
        (a.sampled[0].token, a.sampled[0].logprob),
        (direct.token, direct.logprob)
    );
}

#[test]
fn rejects_invalid_batches_and_positions_past_the_context() {
    let dir = write_model(&TestModelSpec::default().max_position_embeddings(32));
    let mut backend = backend_for(dir.path(), 16, 8);
    let mut bad_slot = one_seq_batch(1, &[1, 2, 3], 0, vec![4], 16, greedy_sample());
    bad_slot.slot_mapping[1] = 0;
    let err = backend.execute_batch(&bad_slot).unwrap_err().to_string();
    assert!(
        err.contains("invalid batch") && err.contains("slot mismatch"),
        "{err}"
    );
    let past = one_seq_batch(1, &[1], 32, vec![0, 1, 2], 16, greedy_sample());
    let err = backend.execute_batch(&past).unwrap_err().to_string();
    assert!(err.contains("max_position_embeddings"), "{err}");
}

#[test]
fn kv_pool_is_sized_from_kv_cache_bytes() {
    let dir = write_model(&TestModelSpec::default());
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    // 2 layers × (K and V) × 2 kv heads × 16 dims × 4 bytes × 16 tokens.
    let per_block = 2 * 2 * 2 * 16 * 4 * 16;
    assert_eq!(KvPool::bytes_per_block(&config, 16), per_block);
    let opts = |bytes| CpuBackendOptions {
        block_size: 16,
        kv_cache_bytes: bytes,
        num_threads: Some(1),
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
        tensor_parallel_size: 1,
    };
    let backend = CpuBackend::load(dir.path(), opts(10 * per_block + per_block / 2)).unwrap();
    let info = backend.info();
    assert_eq!(
        (info.num_kv_blocks, info.block_size, info.bytes_per_block),
        (10, 16, per_block)
    );
    let err = CpuBackend::load(dir.path(), opts(per_block - 1))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("holds no KV block"), "{err}");
}

/// The persistent path: a real scheduler's steps (diffs only after each request's first step)
/// through `Backend::execute`, with a pool small enough to preempt and prompts that share a
/// prefix, against the plain greedy decode of each prompt.
#[test]
fn scheduler_steps_through_the_input_batch_match_the_reference() {
    use crate::executor::testing::{greedy_ignoring_eos, run_to_completion, scheduler_config};
    use crate::kv::KvCacheManager;
    use crate::scheduler::{Policy, Scheduler, SchedulerConfig};

    let spec = TestModelSpec::default();
    let dir = write_model(&spec);
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let weights = load_weights(dir.path(), &config, false).unwrap();
    let (bs, num_blocks, max_tokens) = (16, 9, 6);
    let vocab = config.vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let shared: Vec<u32> = (0..33).map(|_| rng.random_range(0..vocab)).collect();
    let prompts: Vec<Vec<u32>> = [40, 19, 61, 35, 3]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let mut p: Vec<u32> = (0..len).map(|_| rng.random_range(0..vocab)).collect();
            if i % 2 == 0 {
                p.splice(..p.len().min(33), shared.iter().copied());
            }
            p
        })
        .collect();
    for policy in [Policy::Fcfs, Policy::Adaptive] {
        let mut backend = backend_for(dir.path(), bs, num_blocks);
        let mut kv = KvCacheManager::new(num_blocks, bs, true);
        let mut sched = Scheduler::new(SchedulerConfig {
            policy,
            ..scheduler_config(4, 24, config.max_position_embeddings)
        });
        let params = vec![greedy_ignoring_eos(max_tokens); prompts.len()];
        let outputs =
            run_to_completion(&mut backend, &mut kv, &mut sched, &prompts, &params).tokens;
        // `adaptive` keeps KV headroom and avoids preempting; `fcfs` runs into the pool's end.
        if policy == Policy::Fcfs {
            assert!(sched.num_preemptions() > 0, "no preemption");
        }
        assert!(
            kv.prefix_cache_stats().hit_tokens > 0,
            "{policy:?}: no prefix hit"
        );
        for (i, p) in prompts.iter().enumerate() {
            let (want, _) = reference_greedy(&config, &weights, p, max_tokens).unwrap();
            assert_eq!(outputs[i], want, "{policy:?}: request {i}");
        }
    }
}

#[test]
fn sample_below_draws_only_ids_under_the_limit() {
    let dir = write_model(&TestModelSpec::default());
    let prompt: Vec<u32> = (0..9).map(|i| (i * 53 + 7) % 300).collect();
    let batch = |sample| one_seq_batch(3, &prompt, 0, vec![1], 16, sample);
    let logits = backend_for(dir.path(), 16, 8)
        .forward_logits(&batch(greedy_sample()))
        .unwrap()
        .remove(0);
    // The limit cuts the unmasked argmax off: greedy then takes the best id below it, with its
    // log-probability over the ids kept.
    let (top, _) = argmax(&logits);
    assert!(top > 0, "the test prompt's argmax is id 0");
    // 340 of the test model's 417 ids: unmasked, a temperature-1 draw lands past it often.
    let n = top as usize;
    let mut backend = backend_for(dir.path(), 16, 8).sample_below(n);
    let out = backend.execute_batch(&batch(greedy_sample())).unwrap();
    let (want, m) = argmax(&logits[..n]);
    let z: f32 = logits[..n].iter().map(|l| (l - m).exp()).sum();
    assert_eq!(out.sampled[0].token, want);
    assert!((out.sampled[0].logprob - (logits[want as usize] - m - z.ln())).abs() < 1e-4);
    // Drawn at temperature 1, over many seeds: never an id at or past the limit.
    let params = Arc::new(SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    });
    for seed in 0..200 {
        let sample = Some(SampleInput {
            params: params.clone(),
            seed,
            output_index: 0,
        });
        let t = backend.execute_batch(&batch(sample)).unwrap().sampled[0].token;
        assert!((t as usize) < n, "seed {seed}: token {t} >= {n}");
    }
}

/// The executor thread becomes worker 0 of the backend's pool (`on_executor_thread`), so a
/// step runs in place; a second backend on that thread keeps its own pool (a thread belongs to
/// one such pool). Either way the logits are the ones a backend outside got, bit for bit.
#[test]
fn executor_thread_joins_the_pool_and_steps_are_unchanged() {
    let spec = TestModelSpec::default();
    let sc = Scenario::default();
    let dir = write_model(&spec);
    let mut outside = backend_for(dir.path(), sc.block_size, sc.num_blocks);
    assert_eq!(outside.threads.current_thread_index(), None);
    let expect = run_engine(&mut outside, &sc);
    let path = dir.path().to_path_buf();
    let sc2 = sc.clone();
    let (first, second) = std::thread::spawn(move || {
        let mut first = backend_for(&path, sc2.block_size, sc2.num_blocks);
        first.on_executor_thread();
        assert_eq!(first.threads.current_thread_index(), Some(0));
        assert_eq!(first.threads.current_num_threads(), 2);
        let mut second = backend_for(&path, sc2.block_size, sc2.num_blocks);
        second.on_executor_thread();
        assert_eq!(second.threads.current_thread_index(), None);
        (run_engine(&mut first, &sc2), run_engine(&mut second, &sc2))
    })
    .join()
    .unwrap();
    for got in [first, second] {
        assert_eq!(got.len(), expect.len());
        for (g, e) in got.iter().zip(&expect) {
            assert_eq!(g.generated, e.generated);
            assert_eq!(g.logits, e.logits);
        }
    }
}

mod tp;
