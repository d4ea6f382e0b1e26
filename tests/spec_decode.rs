//! Speculative decoding end to end on the CPU backend with the bundled demo pair
//! (models/demo-chat drafted for by models/demo-chat-draft), through the real scheduler core:
//! greedy speculative output equals the transformers goldens (= non-speculative greedy) token
//! for token, with the draft model and with n-gram lookup; a seeded sampled request gives the
//! same tokens on every run; no KV block is leaked by rollback, at any step or at the end.
mod demo;

use brook::executor::cpu::{CpuBackend, CpuBackendOptions};
use brook::model::config::ModelConfig;
use brook::sampling::params::SamplingParams;
use brook::spec::{SpecConfig, SpecMethod};
use demo::{goldens, root, spec, Run};

/// Runs the requests on the CPU backend with the demo target (4-token blocks).
fn run(spec: SpecConfig, prompts: &[Vec<u32>], params: &[SamplingParams], seed: u64) -> Run {
    let dir = root().join("models/demo-chat");
    let config = ModelConfig::from_dir(&dir).unwrap();
    let opts = CpuBackendOptions {
        block_size: 4,
        kv_cache_bytes: 64 << 20,
        num_threads: None,
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
    };
    let mut backend = CpuBackend::load_speculative(&dir, opts, &spec).unwrap();
    let reqs: Vec<(Vec<u32>, SamplingParams)> = prompts
        .iter()
        .cloned()
        .zip(params.iter().cloned())
        .collect();
    demo::run(
        &mut backend,
        spec,
        config.max_position_embeddings,
        &config.eos_token_ids,
        &reqs,
        seed,
    )
}

fn check_greedy_goldens(method: SpecMethod, max_depth: usize) -> Run {
    let cases = goldens();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.0.clone()).collect();
    let params: Vec<SamplingParams> = cases
        .iter()
        .map(|c| SamplingParams::greedy(c.1.len()))
        .collect();
    let r = run(spec(method, max_depth), &prompts, &params, 0);
    for (i, (got, (_, want))) in r.outputs.iter().zip(&cases).enumerate() {
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
    let r = check_greedy_goldens(SpecMethod::Draft, 4);
    // The demo draft agrees with its target often: some drafts must be accepted and some not,
    // so both the accept and the correct-and-roll-back paths ran.
    assert!(
        r.accepted > 0 && r.accepted < r.drafts,
        "{} of {}",
        r.accepted,
        r.drafts
    );
}

#[test]
fn greedy_with_ngram_lookup_equals_the_goldens() {
    check_greedy_goldens(SpecMethod::Ngram, 3);
}

#[test]
fn a_seeded_sampled_request_gives_the_same_tokens_every_run() {
    let cases = goldens();
    let prompts: Vec<Vec<u32>> = cases.iter().take(3).map(|c| c.0.clone()).collect();
    let params: Vec<SamplingParams> = prompts
        .iter()
        .map(|_| SamplingParams {
            temperature: 0.7,
            max_tokens: 32,
            ignore_eos: true,
            ..SamplingParams::default()
        })
        .collect();
    let a = run(spec(SpecMethod::Draft, 3), &prompts, &params, 11);
    let b = run(spec(SpecMethod::Draft, 3), &prompts, &params, 11);
    assert_eq!(a.outputs, b.outputs);
    assert!(
        a.drafts > 0 && a.accepted > 0,
        "{} / {}",
        a.accepted,
        a.drafts
    );
}

#[test]
fn seeded_sampling_with_ngram_lookup_gives_the_tokens_of_no_speculation() {
    let cases = goldens();
    let prompts: Vec<Vec<u32>> = cases.iter().take(4).map(|c| c.0.clone()).collect();
    let params: Vec<SamplingParams> = prompts
        .iter()
        .map(|_| SamplingParams {
            temperature: 0.8,
            max_tokens: 40,
            ignore_eos: true,
            ..SamplingParams::default()
        })
        .collect();
    let off = run(spec(SpecMethod::Off, 1), &prompts, &params, 5);
    let ngram = run(spec(SpecMethod::Ngram, 3), &prompts, &params, 5);
    assert_eq!(ngram.outputs, off.outputs);
    assert!(ngram.drafts > 0, "nothing was verified");
}
