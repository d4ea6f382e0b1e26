//! Speculative decoding end to end on the CPU backend with the bundled demo pair
//! (models/demo-chat drafted for by models/demo-chat-draft), through the real scheduler core:
//! greedy speculative output equals the transformers goldens (= non-speculative greedy) token
//! for token, with the draft model and with n-gram lookup; a seeded sampled request gives the
//! same tokens on every run; no KV block is leaked by rollback, at any step or at the end.
mod demo;

use brook::executor::cpu::{CpuBackend, CpuBackendOptions};
use brook::sampling::params::SamplingParams;
use brook::spec::{SpecConfig, SpecMethod};
use demo::{greedy_goldens, root, sampled, spec, Run};

/// Runs the requests on the CPU backend with the demo target (4-token blocks).
fn run(spec: SpecConfig, reqs: &[(Vec<u32>, SamplingParams)], seed: u64) -> Run {
    run_tp(spec, reqs, seed, 1)
}

/// `run` with the target split over `tp` ranks (the draft model stays whole, beside rank 0).
fn run_tp(spec: SpecConfig, reqs: &[(Vec<u32>, SamplingParams)], seed: u64, tp: usize) -> Run {
    let dir = root().join("models/demo-chat");
    let opts = CpuBackendOptions {
        block_size: 4,
        kv_cache_bytes: 64 << 20,
        num_threads: None,
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
        tensor_parallel_size: tp,
    };
    let mut backend = CpuBackend::load_speculative(&dir, opts, &spec).unwrap();
    demo::run(&mut backend, spec, &dir, reqs, seed)
}

fn check_greedy_goldens(method: SpecMethod, max_depth: usize) -> Run {
    check_greedy_goldens_tp(method, max_depth, 1)
}

fn check_greedy_goldens_tp(method: SpecMethod, max_depth: usize, tp: usize) -> Run {
    let (reqs, want) = greedy_goldens();
    let r = run_tp(spec(method, max_depth), &reqs, 0, tp);
    for (i, (got, want)) in r.outputs.iter().zip(&want).enumerate() {
        assert_eq!(got, want, "case {i}: speculative greedy output differs");
    }
    assert!(
        r.drafts > 0,
        "nothing was verified: the test tested nothing"
    );
    r
}

#[test]
fn greedy_with_the_draft_model_equals_the_goldens() {
    check_greedy_goldens(SpecMethod::Draft, 4).assert_accepts_and_rejects();
}

/// Verification (k + 1 positions a sequence) and KV rollback on a target split over two ranks.
#[test]
fn greedy_with_the_draft_model_over_two_tensor_parallel_ranks_equals_the_goldens() {
    check_greedy_goldens_tp(SpecMethod::Draft, 4, 2).assert_accepts_and_rejects();
}

#[test]
fn greedy_with_ngram_lookup_equals_the_goldens() {
    check_greedy_goldens(SpecMethod::Ngram, 3);
}

#[test]
fn a_seeded_sampled_request_gives_the_same_tokens_every_run() {
    let reqs = sampled(3, 0.7, 32);
    let a = run(spec(SpecMethod::Draft, 3), &reqs, 11);
    let b = run(spec(SpecMethod::Draft, 3), &reqs, 11);
    demo::assert_reproducible(&a, &b);
}

#[test]
fn seeded_sampling_with_ngram_lookup_gives_the_tokens_of_no_speculation() {
    let reqs = sampled(4, 0.8, 40);
    let off = run(spec(SpecMethod::Off, 1), &reqs, 5);
    let ngram = run(spec(SpecMethod::Ngram, 3), &reqs, 5);
    assert_eq!(ngram.outputs, off.outputs);
    assert!(ngram.drafts > 0, "nothing was verified");
}
