//! Tensor parallelism on the CUDA executor (`CudaTpBackend`), its ranks all on GPU 0 (the
//! collectives are staged through the host, so any set of GPUs works, one included): a real
//! scheduler's steps through `Backend::execute`, with a pool small enough to preempt and
//! prompts sharing a prefix. Every generated token must be the CPU reference's greedy choice
//! given the same prefix, away from near ties, as on one GPU (`persistent`). Covered: KV heads
//! split (GQA over 2 ranks), KV heads replicated (2 KV heads over 4 ranks), MHA with tied
//! embeddings and a vocabulary the ranks do not divide (the last rank's slice padded), and the
//! bundled demo model. With a KV host tier on every rank, swapping out and back in and forking
//! (copy-on-write) must leave greedy output exactly as it was without them.

use brook::executor::cuda::backend::kv_bytes_per_block;
use brook::executor::cuda::{CudaTpBackend, KvCacheDtype};
use brook::kv::KvCacheManager;
use brook::model::loader::ModelWeights;
use brook::model::reference::reference_logits;
use brook::model::shard::shard_config;
use brook::scheduler::{PreemptionMode, Scheduler};

use super::harness::{greedy_ignoring_eos, run_to_completion, run_with_kv_tier, scheduler_config};
use super::*;

/// `world` ranks on GPU 0, each with a pool of `blocks` blocks and `host_blocks` on its host
/// tier: `weights` split on the host, or with `streamed` the checkpoint folder streamed to the
/// ranks tensor by tensor (`CudaTpBackend::load_on`).
fn tp_backend(
    config: &ModelConfig,
    weights: &ModelWeights,
    world: usize,
    (blocks, host_blocks): (usize, usize),
    streamed: Option<&Path>,
) -> CudaTpBackend {
    let rank_block = kv_bytes_per_block(&shard_config(config, world), BLOCK, KvCacheDtype::Auto);
    let opts = CudaBackendOptions {
        max_kv_cache_bytes: Some(blocks * rank_block),
        host_kv_cache_bytes: host_blocks * rank_block,
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        progress: false,
        ..Default::default()
    };
    let ordinals = vec![0; world];
    let tp = match streamed {
        Some(dir) => CudaTpBackend::load_on(dir, opts, &ordinals),
        None => CudaTpBackend::from_weights(config.clone(), weights, opts, &ordinals),
    }
    .unwrap();
    let info = tp.info();
    assert_eq!(info.num_kv_blocks, blocks, "{info:?}");
    assert_eq!(info.num_host_blocks, host_blocks, "{info:?}");
    assert_eq!(info.bytes_per_block, rank_block);
    assert!(
        info.device
            .contains(&format!("tensor parallel: {world} ranks")),
        "{}",
        info.device
    );
    tp
}

/// Runs 10 random prompts (half sharing a 40-token prefix) for 12 greedy tokens each over
/// `world` ranks on GPU 0 with a pool of 24 blocks a rank and checks them against the
/// reference; returns the outputs.
fn check_world(
    what: &str,
    config: &ModelConfig,
    weights: &ModelWeights,
    world: usize,
    streamed: Option<&Path>,
) -> Vec<Vec<u32>> {
    let max_tokens = 12;
    // Within the model's context (the Phi-3 fixture's longrope clamps it to 64 tokens).
    let room = config.max_position_embeddings - max_tokens;
    let prompts: Vec<Vec<u32>> = shared_prefix_prompts(config.vocab_size)
        .into_iter()
        .map(|p| p[..p.len().min(room)].to_vec())
        .collect();
    let mut tp = tp_backend(config, weights, world, (24, 0), streamed);
    let mut kv = KvCacheManager::new(24, BLOCK, true).with_sliding_window(config.sliding_window);
    let mut sched = Scheduler::new(scheduler_config(8, 64, config.max_position_embeddings));
    let params = vec![greedy_ignoring_eos(max_tokens); prompts.len()];
    let run = run_to_completion(&mut tp, &mut kv, &mut sched, &prompts, &params);
    match config.sliding_window {
        // Each request holds a window's blocks at most, so the pool need not preempt.
        Some(w) => assert!(run.most_freed > 0, "{what}: window {w} freed nothing"),
        None => assert!(sched.num_preemptions() > 0, "{what}: no preemption"),
    }
    assert!(
        kv.prefix_cache_stats().hit_tokens > 0,
        "{what}: no prefix hit"
    );
    let mut tally = Tally::default();
    for (p, out) in prompts.iter().zip(&run.tokens) {
        assert_eq!(out.len(), max_tokens, "{what}");
        let seq: Vec<u32> = p.iter().chain(out).copied().collect();
        let logits = reference_logits(config, weights, &seq).unwrap();
        for (k, &token) in out.iter().enumerate() {
            let row: Vec<f32> = logits.get(p.len() - 1 + k).unwrap().to_vec1().unwrap();
            tally.check(&row, token);
        }
    }
    eprintln!("tensor parallel, {what}: {tally:?}");
    tally.assert_close(what);
    run.tokens
}

fn check_spec(what: &str, spec: TestModelSpec, world: usize) {
    if !have_gpu() {
        return;
    }
    let (_dir, config, weights) = testing::load_test_model(&spec);
    let split = check_world(what, &config, &weights, world, None);
    // Beside one GPU's run: the same tokens but where rounding moves a near tie.
    let one = check_world(&format!("{what}, 1 rank"), &config, &weights, 1, None);
    let same = split
        .iter()
        .zip(&one)
        .map(|(a, b)| a.iter().zip(b).take_while(|(x, y)| x == y).count())
        .sum::<usize>();
    let total: usize = one.iter().map(Vec::len).sum();
    eprintln!("{what}: {same} of {total} tokens as on one rank before any divergence");
}

#[test]
fn cuda_tp2_gqa_kv_heads_split_matches_the_reference() {
    check_spec("gqa tp2", gqa_hd64().layers(3), 2);
}

#[test]
fn cuda_tp4_kv_heads_replicated_matches_the_reference() {
    check_spec("gqa tp4 replicated", gqa_hd64().layers(3).seed(17), 4);
}

#[test]
fn cuda_tp2_mha_tied_padded_vocabulary_matches_the_reference() {
    let spec = TestModelSpec::default()
        .hidden_size(256)
        .heads(4, 4)
        .head_dim(128)
        .intermediate_size(384)
        .vocab_size(601)
        .tied(true)
        .layers(2)
        .seed(5);
    check_spec("mha tied vocab 601 tp2", spec, 2);
}

/// Every rank applies the step's block copies to its own pools: swapped out and back in, and
/// a forked request's copy-on-write, greedy output is what a pool large enough gave.
#[test]
fn cuda_tp2_swapping_and_forking_leave_greedy_output_unchanged() {
    if !have_gpu() {
        return;
    }
    let (_dir, config, weights) = testing::load_test_model(&gqa_hd64().layers(3).seed(23));
    let mut r = ChaCha8Rng::seed_from_u64(17);
    let vocab = config.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| (0..30 + 5 * i).map(|_| r.random_range(1..vocab)).collect())
        .collect();
    let mut big = tp_backend(&config, &weights, 2, (64, 0), None);
    let want = run_with_kv_tier(&mut big, &prompts, 1, 48, PreemptionMode::Recompute)
        .unwrap()
        .tokens;
    drop(big);
    let mut small = tp_backend(&config, &weights, 2, (12, 64), None);
    let got = run_with_kv_tier(&mut small, &prompts, 1, 48, PreemptionMode::Swap).unwrap();
    assert!(got.swaps > 0, "the small pool must swap");
    assert_eq!(got.tokens, want, "swap-out/in changed greedy output");
    drop(small);
    let mut small = tp_backend(&config, &weights, 2, (12, 64), None);
    let forked = run_with_kv_tier(&mut small, &prompts[..1], 2, 48, PreemptionMode::Swap).unwrap();
    assert!(forked.cow_blocks > 0, "the fork copies the partial block");
    assert_eq!(forked.tokens, vec![want[0].clone(), want[0].clone()]);
}

/// The checkpoint in `folder` (under the repository) streamed to 2 ranks as `brook serve`
/// loads it, checked as `check_world` does.
fn check_streamed(what: &str, folder: &str) {
    if !have_gpu() {
        return;
    }
    let dir = demo::root().join(folder);
    let config = ModelConfig::from_dir(&dir).unwrap();
    let weights = load_weights(&dir, &config, false).unwrap();
    check_world(what, &config, &weights, 2, Some(&dir));
}

/// The bundled demo model.
#[test]
fn cuda_tp2_demo_model_streamed_matches_the_reference() {
    check_streamed("demo tp2 streamed", "models/demo-chat");
}

/// A Phi-3 checkpoint (fused qkv_proj and gate_up_proj, cut part by part as they stream).
#[test]
fn cuda_tp2_phi3_streamed_matches_the_reference() {
    check_streamed("phi3 tp2 streamed", "tests/fixtures/models/phi3");
}
