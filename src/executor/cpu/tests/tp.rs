//! Tensor parallelism on the CPU backend: the model split over 2 and 4 ranks (threads of one
//! `ThreadComm` world) against the plain forward of the whole model, over the scenario's mixed
//! batches, for each head layout and family feature a shard changes (split and replicated KV
//! heads, biases, q/k norms, tied and padded vocabularies, sliding windows); and the backend's
//! edges: its KV accounting, bad batches, copy-on-write and a failing rank.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use super::*;
use crate::executor::actor::panic_message;
use crate::executor::kv_tier::KvTier;
use crate::step::BlockCopy;

#[test]
fn tp2_matches_reference_gqa() {
    assert_matches_reference_tp(&TestModelSpec::default(), &Scenario::default(), 2);
}

#[test]
fn tp2_matches_reference_mha() {
    let spec = TestModelSpec::default().heads(4, 4);
    assert_matches_reference_tp(&spec, &Scenario::default(), 2);
}

/// One KV head over two ranks: each holds a copy.
#[test]
fn tp2_matches_reference_mqa_replicated() {
    let spec = TestModelSpec::default().heads(4, 1);
    assert_matches_reference_tp(&spec, &Scenario::default(), 2);
}

/// Four ranks over 2 KV heads and an MLP of 160: one query head, one replicated KV head and 40
/// MLP columns a rank.
#[test]
fn tp4_matches_reference_with_replicated_kv_heads() {
    assert_matches_reference_tp(&TestModelSpec::default(), &Scenario::default(), 4);
}

/// Tied embeddings and an odd vocabulary: the embedding is the LM head, and the last rank's
/// slice is padded.
#[test]
fn tp2_matches_reference_tied_and_padded_vocabulary() {
    let spec = TestModelSpec::default().tied(true).vocab_size(601);
    assert_matches_reference_tp(&spec, &Scenario::default(), 2);
}

/// q/k/v biases split with their heads, the o bias added once (rank 0's).
#[test]
fn tp2_matches_reference_attention_bias() {
    let spec = TestModelSpec::default().attention_bias(true);
    assert_matches_reference_tp(&spec, &Scenario::default(), 2);
}

#[test]
fn tp2_matches_reference_qwen3_qk_norm() {
    let spec = TestModelSpec::default()
        .architecture(Architecture::Qwen3)
        .heads(6, 2)
        .head_dim(24);
    assert_matches_reference_tp(&spec, &Scenario::default(), 2);
}

#[test]
fn tp2_matches_reference_phi3_with_window() {
    let spec = TestModelSpec::default()
        .architecture(Architecture::Phi3)
        .sliding_window(Some(20));
    assert_matches_reference_tp(&spec, &Scenario::default(), 2);
}

/// A rank holds its KV heads of each block: a block costs it half as much over 2 ranks, and
/// the budget (a rank's) buys twice the blocks, in the host tier too.
#[test]
fn a_ranks_pool_holds_its_kv_heads_of_every_block() {
    let dir = write_model(&TestModelSpec::default());
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let whole = KvPool::bytes_per_block(&config, 16);
    let opts = |tp| CpuBackendOptions {
        block_size: 16,
        kv_cache_bytes: 10 * whole,
        num_threads: Some(2),
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
        tensor_parallel_size: tp,
    };
    let info = |tp| CpuBackend::load(dir.path(), opts(tp)).unwrap().info();
    assert_eq!(
        (info(1).num_kv_blocks, info(1).bytes_per_block),
        (10, whole)
    );
    let two = info(2);
    assert_eq!((two.num_kv_blocks, two.bytes_per_block), (20, whole / 2));
    assert_eq!(two.device, "cpu (tensor parallel: 2 ranks)");
    let host = |tp| {
        let o = CpuBackendOptions {
            host_kv_cache_bytes: 3 * whole,
            copy_bytes_per_s: Some(1e9),
            ..opts(tp)
        };
        CpuBackend::load(dir.path(), o)
            .unwrap()
            .info()
            .num_host_blocks
    };
    assert_eq!((host(1), host(2)), (3, 6));
    let err = CpuBackend::load(dir.path(), opts(3))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("--tensor-parallel-size 3") && err.contains("4 attention heads"),
        "{err}"
    );
}

/// A bad batch fails its step alone, on every rank alike: the world goes on, and the next
/// step's logits are the whole model's.
#[test]
fn a_bad_batch_fails_alone_and_the_ranks_go_on() {
    let dir = write_model(&TestModelSpec::default().max_position_embeddings(32));
    let mut one = backend_for_tp(dir.path(), 16, 8, 1);
    let mut two = backend_for_tp(dir.path(), 16, 8, 2);
    let vocab = two.config().vocab_size as u32;
    let bad_token = one_seq_batch(1, &[1, vocab], 0, vec![4], 16, greedy_sample());
    let err = two.forward_logits(&bad_token).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let past = one_seq_batch(1, &[1], 32, vec![0, 1, 2], 16, greedy_sample());
    let err = two.execute_batch(&past).unwrap_err().to_string();
    assert!(err.contains("max_position_embeddings"), "{err}");
    let mut bad_slot = one_seq_batch(1, &[1, 2, 3], 0, vec![4], 16, greedy_sample());
    bad_slot.slot_mapping[1] = 0;
    let err = two.forward_logits(&bad_slot).unwrap_err().to_string();
    assert!(err.contains("invalid batch"), "{err}");
    let ok = one_seq_batch(2, &[5, 9, 11, 3], 0, vec![6], 16, greedy_sample());
    let (a, b) = (
        one.forward_logits(&ok).unwrap().remove(0),
        two.forward_logits(&ok).unwrap().remove(0),
    );
    assert_close(&a, &b);
}

/// A block copied within the pool (a forked choice's copy-on-write) is copied on every rank:
/// a decode that reads the copy matches the whole model's (an uncopied rank would read NaN).
#[test]
fn copy_on_write_reaches_every_rank() {
    let dir = write_model(&TestModelSpec::default());
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 300).collect();
    let run = |tp| {
        let mut b = backend_for_tp(dir.path(), 16, 8, tp);
        let chunk = one_seq_batch(1, &prompt, 0, vec![2, 6], 16, None);
        b.forward_logits(&chunk).unwrap();
        b.apply_copies(&[BlockCopy::on_device(6, 7)]).unwrap();
        let decode = one_seq_batch(2, &[42], 20, vec![2, 7], 16, greedy_sample());
        b.forward_logits(&decode).unwrap().remove(0)
    };
    let (one, two) = (run(1), run(2));
    assert!(two.iter().all(|x| x.is_finite()));
    assert_close(&one, &two);
}

/// A rank that panics mid-step releases the ranks waiting for it; the step panics (for the
/// executor actor to rebuild the backend) naming the rank, and dropping the backend joins its
/// threads.
#[test]
fn a_failing_rank_panics_the_step_and_the_backend_still_drops() {
    let dir = write_model(&TestModelSpec::default());
    let mut backend = backend_for_tp(dir.path(), 16, 8, 2);
    let peers = backend.peers.as_ref().unwrap();
    peers.fail_next.store(true, Ordering::Relaxed);
    let batch = one_seq_batch(1, &[5, 6, 7], 0, vec![2], 16, greedy_sample());
    let panic = catch_unwind(AssertUnwindSafe(|| backend.forward_logits(&batch))).unwrap_err();
    let msg = panic_message(&*panic);
    assert!(msg.contains("rank 1 panicked: injected"), "{msg}");
    drop(backend);
}

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= TOLERANCE, "logit {i}: {x} vs {y}");
    }
}
