//! The CUDA backend on the path `brook serve` runs: steps from a real scheduler.

use brook::kv::KvCacheManager;
use brook::model::reference::reference_logits;
use brook::scheduler::Scheduler;

use super::harness::{greedy_ignoring_eos, run_to_completion, scheduler_config};
use super::*;

/// The serving path: a real scheduler's steps through `Backend::execute` (requests sent whole
/// once, then per-step diffs; the backend feeds back its own sampled tokens and updates its
/// device block tables in place), with a pool small enough to preempt, rows moving as requests
/// finish, and prompts sharing a prefix; on decode graphs and eagerly. Every generated token
/// must be the CPU reference's greedy choice given the same prefix (teacher-forced), away from
/// near ties. Then issue 18's switches, each alone on graphs: pinned step I/O and lookahead
/// decode must give exactly the default's tokens (same kernels), lookahead must keep some of
/// its predicted steps; the in-kernel split merge with the SM-filling split rule must match
/// the reference.
#[test]
fn cuda_scheduler_steps_on_the_persistent_batch_match_the_cpu() {
    let spec = gqa_hd64().layers(3);
    check_scheduler_steps(spec);
}

/// The same under a sliding window of 24 keys (Mistral): the KV manager frees blocks behind
/// it, the scheduler reports them by count and the device tables take `NULL_BLOCK` there
/// (`block_table_update`), which no kernel may read.
#[test]
fn cuda_scheduler_steps_free_blocks_behind_a_sliding_window() {
    let spec = gqa_hd64()
        .architecture(Architecture::Mistral)
        .layers(3)
        .sliding_window(Some(24))
        .seed(31);
    check_scheduler_steps(spec);
}

fn check_scheduler_steps(spec: TestModelSpec) {
    if !have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &spec).unwrap();
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let weights = load_weights(dir.path(), &config, false).unwrap();
    let prompts = shared_prefix_prompts(config.vocab_size);
    let max_tokens = 12;
    let base = serving_opts(&config);
    let variants = [
        ("graphs", base.clone()),
        (
            "eager",
            CudaBackendOptions {
                cuda_graphs: false,
                ..base.clone()
            },
        ),
        (
            "pinned_io",
            CudaBackendOptions {
                pinned_io: true,
                ..base.clone()
            },
        ),
        (
            "lookahead",
            CudaBackendOptions {
                lookahead: true,
                step_timing: true,
                ..base.clone()
            },
        ),
        (
            // Gated (`--cuda-lookahead auto`): the preemptions and joins here close the gate
            // part of the time, so both its paths run (launched, held back and checked).
            "lookahead_auto",
            CudaBackendOptions {
                lookahead: true,
                lookahead_gate_us: Some(brook::executor::cuda::lookahead::DEFAULT_GAIN_US),
                step_timing: true,
                ..base.clone()
            },
        ),
        (
            "merge_inline+fill8",
            CudaBackendOptions {
                decode_merge_inline: true,
                decode_ctas_per_sm: 8,
                ..base.clone()
            },
        ),
    ];
    let mut default_outputs: Option<Vec<Vec<u32>>> = None;
    for (name, opts) in variants {
        let (lookahead, opts_gated) = (opts.lookahead, opts.lookahead_gate_us.is_some());
        let mut gpu = CudaBackend::from_weights(config.clone(), &weights, opts).unwrap();
        let num_blocks = gpu.info().num_kv_blocks;
        let mut kv =
            KvCacheManager::new(num_blocks, BLOCK, true).with_sliding_window(config.sliding_window);
        let mut sched = Scheduler::new(scheduler_config(8, 64, config.max_position_embeddings));
        let params = vec![greedy_ignoring_eos(max_tokens); prompts.len()];
        let run = run_to_completion(&mut gpu, &mut kv, &mut sched, &prompts, &params);
        let (outputs, most_freed) = (run.tokens, run.most_freed);
        match config.sliding_window {
            // Each request holds a window's blocks at most, so the pool need not preempt.
            Some(w) => assert!(most_freed > 0, "{name}: window {w} freed nothing"),
            None => assert!(sched.num_preemptions() > 0, "{name}: no preemption"),
        }
        assert!(
            kv.prefix_cache_stats().hit_tokens > 0,
            "{name}: no prefix hit"
        );
        let mut tally = Tally::default();
        for (p, out) in prompts.iter().zip(&outputs) {
            assert_eq!(out.len(), max_tokens);
            let seq: Vec<u32> = p.iter().chain(out).copied().collect();
            let logits = reference_logits(&config, &weights, &seq).unwrap();
            for (k, &token) in out.iter().enumerate() {
                let row: Vec<f32> = logits.get(p.len() - 1 + k).unwrap().to_vec1().unwrap();
                tally.check(&row, token);
            }
        }
        eprintln!("persistent batch, {name}: {tally:?}");
        tally.assert_close(name);
        if matches!(name, "pinned_io" | "lookahead" | "lookahead_auto") {
            let want = default_outputs.as_ref().unwrap();
            assert!(&outputs == want, "{name}: tokens differ from the default's");
        }
        if lookahead {
            let st = gpu.lookahead_stats();
            eprintln!("{name}: {st:?}");
            assert!(st.launched >= st.hits, "{st:?}");
            if opts_gated {
                assert!(st.launched + st.held > 0, "{st:?}");
            } else {
                assert!(st.hits > 0 && st.held == 0, "{st:?}");
            }
            // Every launched prediction was either kept or dropped (one may still be in flight).
            assert!(st.hits + st.misses + 1 >= st.launched, "{st:?}");
            let timing = gpu.last_timing().expect("step_timing on");
            assert!(timing.gpu_end_ns > timing.gpu_start_ns, "{timing:?}");
        }
        default_outputs.get_or_insert(outputs);
    }
}
