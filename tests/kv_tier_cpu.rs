//! The KV memory tier end to end on the CPU backend: the real scheduler core and KV manager
//! plan block copies, the real paged CPU backend applies them to its device pool and its host
//! tier. Greedy outputs must equal the unbatched reference forward whatever the tiers did: a
//! swapped-out request resumes from K/V copied back bit-exactly, a host-tier prefix hit computes
//! on K/V it did not compute itself, `n > 1` choices share the prompt's blocks and copy the
//! partial one on write. The same with the model split over two tensor-parallel ranks, each
//! holding its KV heads of every block in both tiers.
/// The test-model writer, compiled here rather than into the library (see its header).
#[path = "../src/model/testing.rs"]
#[allow(dead_code)]
mod testing;

use std::path::Path;
use std::sync::Arc;

use brook::executor::backend::Backend;
use brook::executor::cpu::{CpuBackend, CpuBackendOptions};
use brook::kv::KvCacheManager;
use brook::model::config::ModelConfig;
use brook::model::llama::KvPool;
use brook::model::loader::load_weights;
use brook::model::reference::reference_greedy;
use brook::model::shard::shard_config;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{
    Admission, NewRequest, PreemptDecision, PreemptionMode, Scheduler, SchedulerConfig, SwapCost,
};
use testing::{write_test_model, TestModelSpec};

/// The serving-path harness shared with the CUDA tests (`run_with_kv_tier`).
#[path = "../src/executor/testing.rs"]
#[allow(dead_code)]
mod harness;
use harness::run_with_kv_tier;

const BLOCK: usize = 4;

struct Run {
    /// Generated ids by request id.
    out: std::collections::HashMap<u64, Vec<u32>>,
    kv: KvCacheManager,
    core: Scheduler,
}

struct Setup {
    /// Blocks of each tier (each rank's pools hold as many, of its KV heads).
    device_blocks: usize,
    host_blocks: usize,
    mode: PreemptionMode,
    max_num_seqs: usize,
    tensor_parallel_size: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            device_blocks: 64,
            host_blocks: 64,
            mode: PreemptionMode::Swap,
            max_num_seqs: 8,
            tensor_parallel_size: 1,
        }
    }
}

fn model() -> (tempfile::TempDir, ModelConfig) {
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &TestModelSpec::default()).unwrap();
    let cfg = ModelConfig::from_dir(dir.path()).unwrap();
    (dir, cfg)
}

fn prompt(seed: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| ((seed * 131 + j * 37 + 5) % 250) as u32 + 3)
        .collect()
}

/// Runs `reqs` (id, prompt, max new tokens, n, the step it arrives at) to completion.
fn run(dir: &Path, s: &Setup, reqs: &[(u64, Vec<u32>, usize, usize, usize)]) -> Run {
    let config = ModelConfig::from_dir(dir).unwrap();
    let tp = s.tensor_parallel_size;
    let per_block = KvPool::bytes_per_block(&shard_config(&config, tp), BLOCK);
    let opts = CpuBackendOptions {
        block_size: BLOCK,
        kv_cache_bytes: s.device_blocks * per_block,
        num_threads: Some(2),
        progress: false,
        host_kv_cache_bytes: s.host_blocks * per_block,
        copy_bytes_per_s: Some(1e12),
        tensor_parallel_size: tp,
    };
    let mut backend = CpuBackend::load(dir, opts).unwrap();
    let info = backend.info();
    assert_eq!(
        (info.num_kv_blocks, info.num_host_blocks),
        (s.device_blocks, s.host_blocks)
    );
    let mut kv =
        KvCacheManager::new(info.num_kv_blocks, BLOCK, true).with_host_tier(info.num_host_blocks);
    let mut core = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 32,
        max_num_seqs: s.max_num_seqs,
        max_model_len: config.max_position_embeddings,
        preemption_mode: s.mode,
        ..SchedulerConfig::default()
    });
    core.set_swap_cost(Some(SwapCost {
        bytes_per_block: info.bytes_per_block,
        bytes_per_s: info.copy_bytes_per_s,
    }));
    let mut out = std::collections::HashMap::new();
    let (mut t, mut step) = (0.0, 0);
    while step == 0 || core.has_unfinished() || reqs.iter().any(|r| r.4 >= step) {
        for (id, p, max_new, n, _) in reqs.iter().filter(|r| r.4 == step) {
            let req = NewRequest {
                id: RequestId(*id),
                prompt_token_ids: p.clone(),
                params: Arc::new(SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(*max_new)
                }),
                seed: 1,
                eos_token_ids: Arc::from(vec![]),
                n: *n,
            };
            assert_eq!(core.add_request(req, t), Admission::Accepted);
        }
        t += 0.01;
        step += 1;
        assert!(step < 5_000, "no progress");
        let plan = core.schedule(&mut kv, t);
        let result = backend.execute(&plan).unwrap();
        for u in core.update_from_output(&plan, &result, &mut kv, t) {
            out.entry(u.id.0)
                .or_insert_with(Vec::new)
                .extend(u.new_token_ids);
        }
    }
    assert_eq!(kv.usage().used_blocks, 0, "device blocks leaked");
    if let Some(h) = kv.host_usage() {
        assert_eq!(h.used_blocks, 0, "host blocks leaked");
    }
    Run { out, kv, core }
}

fn reference(dir: &Path, p: &[u32], max_new: usize) -> Vec<u32> {
    let config = ModelConfig::from_dir(dir).unwrap();
    let weights = load_weights(dir, &config, false).unwrap();
    reference_greedy(&config, &weights, p, max_new).unwrap().0
}

#[test]
fn greedy_output_is_unchanged_by_swapping_out_and_in_mid_generation() {
    swapping_keeps_greedy_output(1);
}

/// Every rank swaps its KV heads of the blocks out and back at the same points.
#[test]
fn swapping_over_two_tensor_parallel_ranks_keeps_greedy_output() {
    swapping_keeps_greedy_output(2);
}

fn swapping_keeps_greedy_output(tensor_parallel_size: usize) {
    let (dir, _) = model();
    // Three sequences of up to 14 blocks in 24 device blocks: decodes preempt each other.
    let reqs: Vec<_> = (0..3)
        .map(|i| (i as u64 * 10, prompt(i, 30 + 5 * i), 20, 1, 0))
        .collect();
    for mode in [PreemptionMode::Swap, PreemptionMode::Recompute] {
        let s = Setup {
            device_blocks: 24,
            mode,
            tensor_parallel_size,
            ..Setup::default()
        };
        let r = run(dir.path(), &s, &reqs);
        let st = r.core.stats();
        let t = r.kv.tier_stats();
        if mode == PreemptionMode::Swap {
            assert!(st.preempt_count(PreemptDecision::Swap) > 0, "{st:?}");
            assert!(t.swapped_in_requests > 0 && t.swap_in_blocks > 0, "{t:?}");
        } else {
            assert!(st.preempt_count(PreemptDecision::Recompute) > 0, "{st:?}");
            assert_eq!(t.swapped_out_requests, 0);
        }
        for (id, p, max_new, _, _) in &reqs {
            assert_eq!(
                r.out[id],
                reference(dir.path(), p, *max_new),
                "{mode:?}: request {id}"
            );
        }
    }
}

#[test]
fn a_full_host_tier_recomputes_and_the_output_is_unchanged() {
    let (dir, _) = model();
    let reqs: Vec<_> = (0..3)
        .map(|i| (i as u64 * 10, prompt(i, 30 + 5 * i), 20, 1, 0))
        .collect();
    let s = Setup {
        device_blocks: 24,
        host_blocks: 2,
        ..Setup::default()
    };
    let r = run(dir.path(), &s, &reqs);
    let st = r.core.stats();
    assert!(
        st.preempt_count(PreemptDecision::RecomputeHostFull) > 0,
        "{st:?}"
    );
    for (id, p, max_new, _, _) in &reqs {
        assert_eq!(
            r.out[id],
            reference(dir.path(), p, *max_new),
            "request {id}"
        );
    }
}

#[test]
fn prefix_hits_in_the_host_tier_come_back_and_the_output_is_unchanged() {
    host_prefix_hits_keep_greedy_output(1);
}

#[test]
fn host_tier_prefix_hits_over_two_tensor_parallel_ranks_keep_greedy_output() {
    host_prefix_hits_keep_greedy_output(2);
}

fn host_prefix_hits_keep_greedy_output(tensor_parallel_size: usize) {
    let (dir, _) = model();
    // The first request's prompt blocks are evicted from the 16-block device tier by the
    // second's; the third repeats the first prompt and finds its blocks in the host tier.
    let a = prompt(1, 33);
    let b = prompt(2, 40);
    let reqs = vec![
        (0u64, a.clone(), 4, 1, 0),
        (10, b.clone(), 4, 1, 40),
        (20, a.clone(), 6, 1, 80),
    ];
    let s = Setup {
        device_blocks: 16,
        tensor_parallel_size,
        ..Setup::default()
    };
    let r = run(dir.path(), &s, &reqs);
    let p = r.kv.prefix_cache_stats();
    assert!(p.host_hit_tokens > 0 && p.hit_tokens == 32, "{p:?}");
    assert!(r.kv.tier_stats().offloaded_blocks > 0);
    assert_eq!(r.out[&20], reference(dir.path(), &a, 6));
    assert_eq!(r.out[&10], reference(dir.path(), &b, 4));
}

#[test]
fn n_choices_share_the_prompt_and_copy_the_partial_block_on_write() {
    n_choices_keep_greedy_output(1);
}

#[test]
fn n_choices_over_two_tensor_parallel_ranks_copy_on_write_on_every_rank() {
    n_choices_keep_greedy_output(2);
}

fn n_choices_keep_greedy_output(tensor_parallel_size: usize) {
    let (dir, _) = model();
    // A prompt of 4.5 blocks: the fork shares 4 full blocks and copies the partial one.
    let p = prompt(3, 18);
    let s = Setup {
        tensor_parallel_size,
        ..Setup::default()
    };
    let r = run(dir.path(), &s, &[(0, p.clone(), 10, 3, 0)]);
    assert!(r.kv.tier_stats().cow_blocks >= 2, "{:?}", r.kv.tier_stats());
    let want = reference(dir.path(), &p, 10);
    for id in 0..3 {
        assert_eq!(r.out[&id], want, "choice {id}");
    }
}

/// The geometry of the CUDA test `kv_tier::cuda_greedy_output_is_unchanged_by_swapping_and_forking`
/// (16-token blocks, a 64-token budget, three prompts of 30-40 tokens, 48 greedy tokens each),
/// driven as that test drives it (`harness::run_with_kv_tier`).
mod gpu_geometry {
    use super::*;

    pub const BLOCK: usize = 16;

    pub fn backend(dir: &Path, device: usize, host: usize) -> CpuBackend {
        let config = ModelConfig::from_dir(dir).unwrap();
        let per_block = KvPool::bytes_per_block(&config, BLOCK);
        CpuBackend::load(
            dir,
            CpuBackendOptions {
                block_size: BLOCK,
                kv_cache_bytes: device * per_block,
                num_threads: Some(2),
                progress: false,
                host_kv_cache_bytes: host * per_block,
                // The H200's measured rate (call g), so swap-or-not prices as there.
                copy_bytes_per_s: Some(53e9),
                tensor_parallel_size: 1,
            },
        )
        .unwrap()
    }

    /// The model (in a temporary folder, kept alive by the guard) and the three prompts.
    pub fn model_and_prompts() -> (tempfile::TempDir, Vec<Vec<u32>>) {
        let dir = tempfile::tempdir().unwrap();
        write_test_model(dir.path(), &TestModelSpec::kv_tier()).unwrap();
        let vocab = ModelConfig::from_dir(dir.path()).unwrap().vocab_size as u32;
        (dir, prompts(vocab))
    }

    fn prompts(vocab: u32) -> Vec<Vec<u32>> {
        (0..3)
            .map(|i| {
                (0..30 + 5 * i)
                    .map(|j| ((i * 131 + j * 37 + 5) as u32) % (vocab - 1) + 1)
                    .collect()
            })
            .collect()
    }
}

/// The CUDA swap-and-fork test's workload on the CPU, each run on a backend of its own (a
/// backend serves one scheduler for its life): swapping in a 12-block pool and forking
/// `n = 2` leave greedy output as a pool that never preempts gives it, and the scheduler never
/// sends a request as new while the executor holds it.
#[test]
fn the_gpu_tests_swap_and_fork_workload_keeps_greedy_output_on_the_cpu() {
    use gpu_geometry::*;
    let (dir, prompts) = model_and_prompts();
    let mut big = backend(dir.path(), 64, 4);
    let want = run_with_kv_tier(&mut big, &prompts, 1, 48, PreemptionMode::Recompute).unwrap();
    assert_eq!(want.swaps, 0);
    let mut small = backend(dir.path(), 12, 64);
    let got = run_with_kv_tier(&mut small, &prompts, 1, 48, PreemptionMode::Swap).unwrap();
    assert!(got.swaps > 0, "the small pool must swap");
    assert!(
        got.overlapped_copies > 0,
        "copies back run under the forward"
    );
    assert_eq!(got.tokens, want.tokens, "swap-out/in changed greedy output");
    let mut small = backend(dir.path(), 12, 64);
    let forked = run_with_kv_tier(&mut small, &prompts[..1], 2, 48, PreemptionMode::Swap).unwrap();
    assert!(forked.cow_blocks > 0, "the fork copies the partial block");
    let want0 = want.tokens[0].clone();
    assert_eq!(forked.tokens, vec![want0.clone(), want0]);
}

/// Why the CUDA test failed on the H200 (call g, "req-2: sent as new, but the executor holds
/// it"): it ran a second scheduler on the backend of the first. The requests that finish in a
/// run's last step are dropped from the executor with the next step it runs, which never comes;
/// the next scheduler's requests reuse their ids. The persistent batch refuses that step, on
/// the CPU as on the GPU.
#[test]
fn a_backend_reused_by_a_second_scheduler_refuses_a_request_it_still_holds() {
    use gpu_geometry::*;
    let (dir, prompts) = model_and_prompts();
    let mut small = backend(dir.path(), 12, 64);
    run_with_kv_tier(&mut small, &prompts, 1, 48, PreemptionMode::Swap).unwrap();
    let err = run_with_kv_tier(&mut small, &prompts, 1, 48, PreemptionMode::Swap)
        .expect_err("the first run's last requests are still held")
        .to_string();
    assert!(
        err.contains("req-2: sent as new, but the executor holds it"),
        "{err}"
    );
}
