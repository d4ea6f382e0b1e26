//! The CUDA sampler's request features on the serving path: penalties over the device token
//! counts (kept by the persistent batch's count ops through preemptions, row moves and prefix
//! hits), logit bias and logprobs, against the CPU reference.

use brook::kv::KvCacheManager;
use brook::model::reference::reference_logits;
use brook::sampling::sampler::{process_logits, TokenCounts};
use brook::scheduler::Scheduler;

use super::harness::{run_to_completion, scheduler_config, top2_gap, NEAR_TIE};
use super::*;

/// Greedy requests with presence, frequency and repetition penalties and a logit bias, through
/// a real scheduler's steps (a pool small enough to preempt, so rows are dropped, moved and
/// re-sent whole with their output). Every token must be the argmax of the CPU reference's
/// logits after the same processing, given the same prefix (teacher-forced), away from near
/// ties; every token has its logprobs with 3 alternatives, most likely first. Also with issue
/// 18's pinned I/O and lookahead (the default's tokens exactly), and lookahead with bias and
/// logprobs but no penalties (steps launched ahead are kept).
#[test]
fn cuda_penalties_on_the_persistent_batch_match_the_cpu() {
    if !have_gpu() {
        return;
    }
    let spec = gqa_hd64().layers(3);
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &spec).unwrap();
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let weights = load_weights(dir.path(), &config, false).unwrap();
    let mut r = ChaCha8Rng::seed_from_u64(12);
    let vocab = config.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..10)
        .map(|_| {
            (0..r.random_range(20..90))
                .map(|_| r.random_range(0..vocab))
                .collect()
        })
        .collect();
    let max_tokens = 16;
    let base = serving_opts(&config);
    // Issue 18's switches: pinned I/O reads the top log-probabilities from its stage; lookahead
    // runs nothing ahead while a row has penalties, and with none (bias and logprobs only) keeps
    // predicted steps whose logit edits and top log-probabilities must be the real step's.
    let variants = [
        ("graphs", true, base.clone()),
        (
            "eager",
            true,
            CudaBackendOptions {
                cuda_graphs: false,
                ..base.clone()
            },
        ),
        (
            "pinned_io",
            true,
            CudaBackendOptions {
                pinned_io: true,
                ..base.clone()
            },
        ),
        (
            "lookahead",
            true,
            CudaBackendOptions {
                lookahead: true,
                ..base.clone()
            },
        ),
        (
            "lookahead without penalties",
            false,
            CudaBackendOptions {
                lookahead: true,
                ..base.clone()
            },
        ),
    ];
    let mut default_outputs = None;
    for (name, penalties, opts) in variants {
        // Half the requests with penalties (rows with and without counts interleave).
        let params: Vec<Arc<SamplingParams>> = (0..prompts.len())
            .map(|i| {
                let mut p = SamplingParams {
                    ignore_eos: true,
                    logprobs: Some(3),
                    logit_bias: vec![(5, 0.5), (vocab - 1, -1.0)],
                    ..SamplingParams::greedy(max_tokens)
                };
                if penalties && i % 2 == 0 {
                    p.presence_penalty = 0.4;
                    p.frequency_penalty = 0.3;
                    p.repetition_penalty = 1.3;
                }
                Arc::new(p)
            })
            .collect();
        let lookahead = opts.lookahead;
        let mut gpu = CudaBackend::from_weights(config.clone(), &weights, opts).unwrap();
        let mut kv = KvCacheManager::new(gpu.info().num_kv_blocks, BLOCK, true);
        let mut sched = Scheduler::new(scheduler_config(8, 64, config.max_position_embeddings));
        let run = run_to_completion(&mut gpu, &mut kv, &mut sched, &prompts, &params);
        let (outputs, logprobs) = (run.tokens, run.logprobs);
        assert!(sched.num_preemptions() > 0, "{name}: no preemption");
        let mut tally = Tally::default();
        let mut processed = Vec::new();
        for (i, (p, out)) in prompts.iter().zip(&outputs).enumerate() {
            assert_eq!(out.len(), max_tokens);
            let seq: Vec<u32> = p.iter().chain(out).copied().collect();
            let logits = reference_logits(&config, &weights, &seq).unwrap();
            for (k, &token) in out.iter().enumerate() {
                let row: Vec<f32> = logits.get(p.len() - 1 + k).unwrap().to_vec1().unwrap();
                let counts = TokenCounts::new(p, &out[..k]);
                process_logits(&row, &params[i], k, Some(&counts), &mut processed);
                if tally.check(&processed, token) {
                    eprintln!("request {i} token {k}: {token} vs {}", argmax(&processed).0);
                }
                let lp = &logprobs[i][k];
                assert_eq!(lp.token, token);
                assert_eq!(lp.top.len(), 3);
                assert!(lp.top[0].1 >= lp.top[1].1 && lp.top[1].1 >= lp.top[2].1);
                // The alternatives are the raw distribution's: its argmax leads, near ties aside.
                if top2_gap(&row) >= NEAR_TIE {
                    assert_eq!(lp.top[0].0, argmax(&row).0, "request {i} token {k}");
                }
            }
        }
        eprintln!("penalties on the persistent batch, {name}: {tally:?}");
        tally.assert_close(name);
        // Same kernels and params: exactly the default's tokens.
        match name {
            "graphs" => default_outputs = Some(outputs.clone()),
            "pinned_io" | "lookahead" => assert!(
                default_outputs.as_ref() == Some(&outputs),
                "{name}: tokens differ from the default's"
            ),
            _ => {}
        }
        if lookahead {
            let st = gpu.lookahead_stats();
            eprintln!("{name}: {st:?}");
            if !penalties {
                assert!(st.hits > 0, "{name}: no step kept: {st:?}");
            }
        }
    }
}
