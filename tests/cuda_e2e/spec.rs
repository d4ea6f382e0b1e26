//! Speculative decoding on the CUDA backend with the bundled demo pair, through the real
//! scheduler core (`demo::run`): greedy speculative output equals the backend's own
//! non-speculative greedy output token for token, with n-gram lookup and with the draft model;
//! seeded sampling with n-gram lookup gives the tokens of no speculation (the device's draws
//! at each position are kept while they equal the drafts); no KV block leaked by rollback.
//! Also with CUDA graphs off and with lookahead decode on: steps with drafts take the eager
//! path and are never launched ahead.

use brook::executor::cuda::backend::kv_bytes_per_block;
use brook::spec::{SpecConfig, SpecMethod};

use super::demo::{self, goldens, root, spec, Run};
use super::*;

fn demo_opts(spec: &SpecConfig) -> CudaBackendOptions {
    CudaBackendOptions {
        max_kv_cache_bytes: Some(64 << 20),
        max_num_batched_tokens: 256,
        max_num_seqs: 16,
        max_drafts: spec.max_depth,
        progress: false,
        ..Default::default()
    }
}

/// Runs `reqs` on the CUDA backend with the demo target, speculating as `spec` says.
fn run_cuda(
    spec: SpecConfig,
    opts: CudaBackendOptions,
    reqs: &[(Vec<u32>, SamplingParams)],
    seed: u64,
) -> Run {
    let dir = root().join("models/demo-chat");
    let config = ModelConfig::from_dir(&dir).unwrap();
    let mut backend = CudaBackend::load_speculative(&dir, opts, &spec).unwrap();
    demo::run(
        &mut backend,
        spec,
        config.max_position_embeddings,
        &config.eos_token_ids,
        reqs,
        seed,
    )
}

fn greedy_goldens() -> Vec<(Vec<u32>, SamplingParams)> {
    goldens()
        .into_iter()
        .map(|(p, out)| (p, SamplingParams::greedy(out.len())))
        .collect()
}

/// Asserts `got` equals `want` request by request, naming the first divergence.
fn assert_same(got: &Run, want: &Run, what: &str) {
    for (i, (g, w)) in got.outputs.iter().zip(&want.outputs).enumerate() {
        let at = g.iter().zip(w).position(|(a, b)| a != b);
        assert!(
            g == w,
            "{what}: request {i} differs from no speculation (first at output {at:?}, lengths {} vs {})",
            g.len(),
            w.len()
        );
    }
    assert!(got.drafts > 0, "{what}: nothing was verified");
}

fn check_greedy(method: SpecMethod, depth: usize) -> Run {
    let reqs = greedy_goldens();
    let off = spec(SpecMethod::Off, depth);
    let want = run_cuda(off.clone(), demo_opts(&off), &reqs, 0);
    let s = spec(method, depth);
    let got = run_cuda(s.clone(), demo_opts(&s), &reqs, 0);
    assert_same(&got, &want, method.as_str());
    // The same with the decode graphs off, and with lookahead decode on.
    for (name, opts) in [
        (
            "eager",
            CudaBackendOptions {
                cuda_graphs: false,
                ..demo_opts(&s)
            },
        ),
        (
            "lookahead",
            CudaBackendOptions {
                lookahead: true,
                ..demo_opts(&s)
            },
        ),
    ] {
        let r = run_cuda(s.clone(), opts, &reqs, 0);
        assert_same(&r, &want, &format!("{} {name}", method.as_str()));
    }
    got
}

#[test]
fn cuda_spec_ngram_greedy_equals_no_speculation() {
    if !have_gpu() {
        return;
    }
    check_greedy(SpecMethod::Ngram, 3);
}

#[test]
fn cuda_spec_ngram_seeded_sampling_equals_no_speculation() {
    if !have_gpu() {
        return;
    }
    let reqs: Vec<(Vec<u32>, SamplingParams)> = goldens()
        .into_iter()
        .take(4)
        .map(|(p, _)| {
            let params = SamplingParams {
                temperature: 0.8,
                max_tokens: 40,
                ignore_eos: true,
                ..SamplingParams::default()
            };
            (p, params)
        })
        .collect();
    let off = spec(SpecMethod::Off, 3);
    let want = run_cuda(off.clone(), demo_opts(&off), &reqs, 5);
    let s = spec(SpecMethod::Ngram, 3);
    let got = run_cuda(s.clone(), demo_opts(&s), &reqs, 5);
    assert_same(&got, &want, "ngram sampled");
}

#[test]
fn cuda_spec_draft_model_greedy_equals_no_speculation() {
    if !have_gpu() {
        return;
    }
    let r = check_greedy(SpecMethod::Draft, 4);
    // The demo draft agrees with its target often: both the accept and the
    // correct-and-roll-back paths ran.
    assert!(
        r.accepted > 0 && r.accepted < r.drafts,
        "{} of {}",
        r.accepted,
        r.drafts
    );
}

/// The draft's pool shares the target's block ids: a block's bytes count both models' K/V.
#[test]
fn cuda_spec_draft_kv_counts_in_each_block() {
    if !have_gpu() {
        return;
    }
    let s = spec(SpecMethod::Draft, 2);
    let dir = root().join("models/demo-chat");
    let target = ModelConfig::from_dir(&dir).unwrap();
    let draft = ModelConfig::from_dir(&root().join("models/demo-chat-draft")).unwrap();
    let b = CudaBackend::load_speculative(&dir, demo_opts(&s), &s).unwrap();
    let bs = b.info().block_size;
    assert_eq!(
        b.info().bytes_per_block,
        kv_bytes_per_block(&target, bs) + kv_bytes_per_block(&draft, bs)
    );
    // Without drafts the sampler's buffers cannot hold a verification: refused at start.
    let small = CudaBackendOptions {
        max_drafts: 1,
        ..demo_opts(&s)
    };
    let e = CudaBackend::load_speculative(&dir, small, &s)
        .err()
        .unwrap();
    assert!(e.to_string().contains("max_drafts"), "{e}");
}

/// Sampled requests with the draft model: their drafts are drawn from the draft's
/// distribution, verified on the host from their rows' logits (Leviathan/Chen); seeded, the
/// same tokens on every run.
#[test]
fn cuda_spec_draft_model_seeded_sampling_is_reproducible() {
    if !have_gpu() {
        return;
    }
    let reqs: Vec<(Vec<u32>, SamplingParams)> = goldens()
        .into_iter()
        .take(3)
        .map(|(p, _)| {
            let params = SamplingParams {
                temperature: 0.7,
                max_tokens: 32,
                ignore_eos: true,
                ..SamplingParams::default()
            };
            (p, params)
        })
        .collect();
    let s = spec(SpecMethod::Draft, 3);
    let a = run_cuda(s.clone(), demo_opts(&s), &reqs, 11);
    let b = run_cuda(s.clone(), demo_opts(&s), &reqs, 11);
    assert_eq!(a.outputs, b.outputs);
    assert!(
        a.drafts > 0 && a.accepted > 0,
        "{} / {}",
        a.accepted,
        a.drafts
    );
}
