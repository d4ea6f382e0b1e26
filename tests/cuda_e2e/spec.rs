//! Speculative decoding on the CUDA backend with the bundled demo pair, through the real
//! scheduler core (`demo::run`): greedy speculative output equals the backend's own
//! non-speculative greedy output token for token, with n-gram lookup and with the draft model;
//! seeded sampling with n-gram lookup gives the tokens of no speculation (the device's draws
//! at each position are kept while they equal the drafts); no KV block leaked by rollback.
//! Also with CUDA graphs off and with lookahead decode on: steps with drafts take the eager
//! path and are never launched ahead. And with verification graphs on (`verify_graphs`,
//! opt-in): the mixed batch and batch 1 give the same tokens, and the graph path (padded with
//! dummy verifications where the batch is not a bucket) is seen to run.

use brook::executor::cuda::backend::kv_bytes_per_block;
use brook::executor::cuda::KvCacheDtype;
use brook::spec::{SpecConfig, SpecMethod};

use super::demo::{self, greedy_goldens, root, sampled, spec, Req, Run};
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

/// Runs `reqs` on the CUDA backend with the demo target, speculating as `spec` says; None
/// without a GPU.
fn run_cuda(spec: SpecConfig, opts: CudaBackendOptions, reqs: &[Req], seed: u64) -> Option<Run> {
    run_counted(spec, opts, reqs, seed).map(|(run, _)| run)
}

/// `run_cuda`, and the verification steps replayed from graphs (all, padded).
fn run_counted(
    spec: SpecConfig,
    opts: CudaBackendOptions,
    reqs: &[Req],
    seed: u64,
) -> Option<(Run, (u64, u64))> {
    if !have_gpu() {
        return None;
    }
    let dir = root().join("models/demo-chat");
    let rows = opts.max_num_seqs;
    let mut backend = CudaBackend::load_speculative(&dir, opts, &spec).unwrap();
    // The scheduler runs at most the backend's rows, as in serving (one config sets both); the
    // greedy goldens are more requests than that, so some wait for a row.
    let run = demo::run_rows(&mut backend, rows, spec, &dir, reqs, seed);
    Some((run, backend.verify_graph_steps()))
}

/// `opts` with verification graphs on.
fn verify_graphs(opts: CudaBackendOptions) -> CudaBackendOptions {
    CudaBackendOptions {
        verify_graphs: true,
        ..opts
    }
}

/// `opts` with one row: batch 1, the requests one after another.
fn one_row(opts: CudaBackendOptions) -> CudaBackendOptions {
    CudaBackendOptions {
        max_num_seqs: 1,
        ..opts
    }
}

/// `reqs` run under each of `specs`, each on a fresh backend (`demo_opts`).
fn run_pair(specs: (SpecConfig, SpecConfig), reqs: &[Req], seed: u64) -> Option<(Run, Run)> {
    let (a, b) = specs;
    let ra = run_cuda(a.clone(), demo_opts(&a), reqs, seed)?;
    let rb = run_cuda(b.clone(), demo_opts(&b), reqs, seed)?;
    Some((ra, rb))
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

/// Greedy speculation by `method` equals no speculation (graphs on, off, lookahead on); the
/// speculative run's figures, or None without a GPU.
fn check_greedy(method: SpecMethod, depth: usize) -> Option<Run> {
    let (reqs, _) = greedy_goldens();
    let s = spec(method, depth);
    let (want, got) = run_pair((spec(SpecMethod::Off, depth), s.clone()), &reqs, 0)?;
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
        let r = run_cuda(s.clone(), opts, &reqs, 0)?;
        assert_same(&r, &want, &format!("{} {name}", method.as_str()));
    }
    // Verification graphs, the mixed batch (the goldens' lengths differ, so few steps verify
    // one k in every sequence).
    let what = format!("{} verify-graphs", method.as_str());
    let (r, (steps, padded)) = run_counted(s.clone(), verify_graphs(demo_opts(&s)), &reqs, 0)?;
    eprintln!("{what}: {steps} verification steps from graphs, {padded} padded");
    assert_same(&r, &want, &what);
    if method == SpecMethod::Draft {
        // Three requests of one length, prefilled in one step: the draft model at its fixed
        // depth gives each the same k every step, and three sequences run in bucket 4, padded.
        let three: Vec<Req> = reqs
            .iter()
            .take(3)
            .map(|(p, _)| {
                let params = SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(24)
                };
                (p.clone(), params)
            })
            .collect();
        let off = spec(SpecMethod::Off, depth);
        let want3 = run_cuda(off.clone(), demo_opts(&off), &three, 0)?;
        let (r3, (steps3, padded3)) =
            run_counted(s.clone(), verify_graphs(demo_opts(&s)), &three, 0)?;
        eprintln!("{what} three: {steps3} verification steps from graphs, {padded3} padded");
        assert_same(&r3, &want3, &format!("{what} three"));
        assert!(
            padded3 > 0,
            "{what} three: no padded verification graph ran"
        );
    }
    // Batch 1: every verification is a graph's (bucket 1), against no speculation at batch 1.
    let off = spec(SpecMethod::Off, depth);
    let want1 = run_cuda(off.clone(), one_row(demo_opts(&off)), &reqs, 0)?;
    let opts1 = one_row(verify_graphs(demo_opts(&s)));
    let (r1, (steps1, _)) = run_counted(s.clone(), opts1, &reqs, 0)?;
    assert_same(&r1, &want1, &format!("{what} batch 1"));
    assert!(steps1 > 0, "{what} batch 1: no verification graph ran");
    // Lookahead beside verification graphs: decode steps ahead, verifications from graphs.
    let opts = CudaBackendOptions {
        lookahead: true,
        ..verify_graphs(demo_opts(&s))
    };
    let r = run_cuda(s.clone(), opts, &reqs, 0)?;
    assert_same(&r, &want, &format!("{what} lookahead"));
    Some(got)
}

/// The device's draws at each position are kept while they equal the drafts: the tokens of
/// no speculation for a seed.
#[test]
fn cuda_spec_ngram_seeded_sampling_equals_no_speculation() {
    let pair = (spec(SpecMethod::Off, 3), spec(SpecMethod::Ngram, 3));
    let reqs = sampled(4, 0.8, 40);
    if let Some((want, got)) = run_pair(pair.clone(), &reqs, 5) {
        assert_same(&got, &want, "ngram sampled");
        // From verification graphs: the mixed batch, then batch 1 against batch 1.
        let s = pair.1;
        let r = run_cuda(s.clone(), verify_graphs(demo_opts(&s)), &reqs, 5).unwrap();
        assert_same(&r, &want, "ngram sampled verify-graphs");
        let off = run_cuda(pair.0.clone(), one_row(demo_opts(&pair.0)), &reqs, 5).unwrap();
        let opts1 = one_row(verify_graphs(demo_opts(&s)));
        let (r1, (steps, _)) = run_counted(s, opts1, &reqs, 5).unwrap();
        assert_same(&r1, &off, "ngram sampled verify-graphs batch 1");
        assert!(
            steps > 0,
            "ngram sampled batch 1: no verification graph ran"
        );
    }
}

#[test]
fn cuda_spec_draft_model_greedy_equals_no_speculation() {
    if let Some(r) = check_greedy(SpecMethod::Draft, 4) {
        r.assert_accepts_and_rejects();
    }
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
        kv_bytes_per_block(&target, bs, KvCacheDtype::Auto)
            + kv_bytes_per_block(&draft, bs, KvCacheDtype::Auto)
    );
    // Without room for the drafts the sampler's buffers cannot hold a verification: refused
    // at start.
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
    let pair = (spec(SpecMethod::Draft, 3), spec(SpecMethod::Draft, 3));
    let reqs = sampled(3, 0.7, 32);
    if let Some((a, b)) = run_pair(pair.clone(), &reqs, 11) {
        demo::assert_reproducible(&a, &b);
        // From verification graphs (three requests at k = 3: bucket 4, one dummy; their
        // logit rows read back for the host's rejection sampling), twice.
        let s = pair.0;
        let (c, (_, padded)) =
            run_counted(s.clone(), verify_graphs(demo_opts(&s)), &reqs, 11).unwrap();
        let (d, _) = run_counted(s.clone(), verify_graphs(demo_opts(&s)), &reqs, 11).unwrap();
        demo::assert_reproducible(&c, &d);
        assert!(
            padded > 0,
            "draft sampled: no padded verification graph ran"
        );
    }
}

#[test]
fn cuda_spec_ngram_greedy_equals_no_speculation() {
    check_greedy(SpecMethod::Ngram, 3);
}
