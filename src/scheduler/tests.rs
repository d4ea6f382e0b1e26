//! Scheduler tests against a fake executor.
//!
//! The fake model keeps a "KV cache" of token ids per slot. A sequence's next token is a hash
//! of the context it reads back through its block table, so wrong slots, stale blocks or a bad
//! prefix-cache hit change the output. Every run is compared with a plain, unbatched reference
//! decode of the same requests.
//!
//! The fake model, the reference decode and the `Engine` that runs them are in `harness.rs`.
//!
//! (Over 600 lines: the randomized-load and preemption tests share the harness and reference;
//! the policy-specific tests are in tests/.)

mod adaptive;
mod admission;
mod deadline;
mod edf;
mod harness;
mod merge;
mod slack;
mod spec;
mod tiers;
mod window;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use self::harness::*;
use super::*;
use crate::kv::KvCacheManager;
use crate::request::{FinishReason, RequestId};
use crate::sampling::params::SamplingParams;
use crate::step::StepOutput;

const BLOCK_SIZE: usize = 4;
const EOS: u32 = 2;
/// Ids the fake model never produces on its own (EOS among them); scripts use them.
const RESERVED: u32 = 16;
const VOCAB: u32 = 32_000;

fn config() -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 512,
        long_prefill_token_threshold: 0,
        ..SchedulerConfig::default()
    }
}

fn random_tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(RESERVED..VOCAB)).collect()
}

/// A 13-token random prompt, 6 output tokens, eos on.
fn request(id: u64) -> NewRequest {
    NewRequest {
        id: RequestId(id),
        prompt_token_ids: random_tokens(1000 + id, 13),
        params: Arc::new(SamplingParams {
            max_tokens: 6,
            ..SamplingParams::default()
        }),
        seed: 0x5eed ^ id,
        eos_token_ids: Arc::from(vec![EOS, EOS + 1]),
        n: 1,
    }
}

/// One-knob overrides on top of `request()`.
trait Knobs: Sized {
    fn prompt_len(self, n: usize) -> Self;
    fn prompt(self, tokens: Vec<u32>) -> Self;
    fn max_tokens(self, n: usize) -> Self;
    fn ignore_eos(self) -> Self;
    fn stop_token_ids(self, ids: Vec<u32>) -> Self;
}

impl Knobs for NewRequest {
    fn prompt_len(mut self, n: usize) -> Self {
        self.prompt_token_ids = random_tokens(1000 + self.id.0, n);
        self
    }
    fn prompt(mut self, tokens: Vec<u32>) -> Self {
        self.prompt_token_ids = tokens;
        self
    }
    fn max_tokens(mut self, n: usize) -> Self {
        Arc::make_mut(&mut self.params).max_tokens = n;
        self
    }
    fn ignore_eos(mut self) -> Self {
        Arc::make_mut(&mut self.params).ignore_eos = true;
        self
    }
    fn stop_token_ids(mut self, ids: Vec<u32>) -> Self {
        Arc::make_mut(&mut self.params).stop_token_ids = ids;
        self
    }
}

fn scheduled(out: &SchedulerOutput) -> Vec<(u64, usize)> {
    out.num_scheduled_tokens()
        .map(|(id, n)| (id.0, n))
        .collect()
}

#[test]
fn decodes_first_then_prefill_chunks_from_the_remaining_budget() {
    let mut e = Engine::new(
        SchedulerConfig {
            max_num_batched_tokens: 32,
            ..config()
        },
        64,
    );
    for id in 1..=3 {
        e.add(request(id).prompt_len(5 + id as usize));
    }
    let (out, _) = e.step();
    assert_eq!(scheduled(&out), vec![(1, 6), (2, 7), (3, 8)]);
    assert_eq!(out.admitted.len(), 3);
    e.add(request(4).prompt_len(100));
    let (out, updates) = e.step();
    assert_eq!(scheduled(&out), vec![(1, 1), (2, 1), (3, 1), (4, 29)]);
    assert_eq!((out.num_decode_seqs, out.num_prefill_tokens), (3, 29));
    assert!(!out.scheduled[3].sample);
    assert_eq!(
        updates.iter().map(|u| u.id.0).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

#[test]
fn chunked_prefill_spans_steps() {
    let mut e = Engine::new(
        SchedulerConfig {
            max_num_batched_tokens: 32,
            ..config()
        },
        64,
    );
    e.add(request(1).prompt_len(100));
    for (i, chunk) in [32, 32, 32, 4].into_iter().enumerate() {
        let (out, updates) = e.step();
        assert_eq!(scheduled(&out), vec![(1, chunk)]);
        let seq = &out.scheduled[0];
        assert_eq!(seq.num_computed_tokens + seq.num_tokens, 32 * i + chunk);
        assert_eq!(seq.num_computed_tokens, 32 * i);
        let last = i == 3;
        assert_eq!(seq.sample, last);
        assert_eq!(updates.len(), usize::from(last));
    }
    let (out, _) = e.step();
    assert_eq!(scheduled(&out), vec![(1, 1)]);
    assert_eq!(out.scheduled[0].num_computed_tokens, 100);
    e.run_to_completion();
    e.assert_matches_reference();
}

#[test]
fn long_prefill_threshold_caps_each_chunk() {
    let cfg = SchedulerConfig {
        long_prefill_token_threshold: 10,
        ..config()
    };
    let mut e = Engine::new(cfg, 64);
    e.add(request(1).prompt_len(35));
    e.add(request(2).prompt_len(7));
    let (out, _) = e.step();
    assert_eq!(scheduled(&out), vec![(1, 10), (2, 7)]);
    let (out, _) = e.step();
    assert_eq!(scheduled(&out), vec![(1, 10), (2, 1)]);
    e.run_to_completion();
    e.assert_matches_reference();
}

#[test]
fn max_num_seqs_bounds_the_running_set() {
    let mut e = Engine::new(
        SchedulerConfig {
            max_num_seqs: 2,
            ..config()
        },
        64,
    );
    for id in 1..=5 {
        e.add(request(id).max_tokens(2 + id as usize));
    }
    let (out, _) = e.step();
    assert_eq!(scheduled(&out).len(), 2);
    assert_eq!((e.sched.num_running(), e.sched.num_waiting()), (2, 3));
    e.run_to_completion();
    e.assert_matches_reference();
}

#[test]
fn preemption_recomputes_and_gives_the_same_tokens() {
    // 2 requests of 8 prompt + 24 output tokens need 16 blocks together; there are 12.
    let cfg = config();
    let mut e = Engine::new(cfg, 12);
    e.add(request(1).prompt_len(8).max_tokens(24).ignore_eos());
    e.add(request(2).prompt_len(8).max_tokens(24).ignore_eos());
    let mut preempted: Vec<RequestId> = Vec::new();
    let mut resumed_prefill = None;
    while e.sched.has_unfinished() {
        let (out, _) = e.step();
        if !out.preempted.is_empty() {
            // The lowest priority (latest admitted) goes, and waits at the front.
            assert_eq!(out.preempted, vec![RequestId(2)]);
            assert!(scheduled(&out).iter().all(|&(id, _)| id == 1));
            assert!(out.admitted.is_empty());
            preempted.extend(&out.preempted);
        } else if !preempted.is_empty() && resumed_prefill.is_none() {
            resumed_prefill = scheduled(&out)
                .iter()
                .find(|&&(id, _)| id == 2)
                .map(|&(_, n)| n);
        }
    }
    assert_eq!(preempted.len(), 1);
    assert_eq!(e.sched.num_preemptions(), 1);
    // The resume recomputes prompt and output so far (less any prefix-cache hit): more than 1.
    assert!(resumed_prefill.unwrap() > 1);
    assert_eq!(e.kv.usage().used_blocks, 0);
    e.assert_matches_reference();
}

#[test]
fn a_lost_executor_re_queues_its_requests_and_they_recompute_the_same_tokens() {
    let mut e = Engine::new(config(), 64);
    e.add(request(1).prompt_len(9).max_tokens(12).ignore_eos());
    e.add(request(2).prompt_len(10).max_tokens(12).ignore_eos());
    for _ in 0..4 {
        e.step();
    }
    // The backend was rebuilt: its rows and its K/V are gone, and so must the prefix cache be.
    assert_eq!(e.sched.executor_lost(&mut e.kv), 2);
    e.kv.reset_prefix_cache();
    e.model = FakeModel::new(64, None);
    assert_eq!((e.sched.num_running(), e.sched.num_waiting()), (0, 2));
    assert_eq!(e.kv.usage().used_blocks, 0);
    e.check();
    // Each comes back whole (prompt and output so far), in its old order.
    let (out, _) = e.step();
    let sent: Vec<(u64, usize)> = (out.scheduled.iter())
        .map(|s| (s.id.0, s.new.as_ref().map_or(0, |n| n.token_ids.len())))
        .collect();
    assert_eq!(sent.len(), 2);
    for (&(id, n), want) in sent.iter().zip([1, 2]) {
        assert_eq!(id, want);
        assert!(n > 10, "{id}: {n} tokens resent");
    }
    assert!(
        out.finished_req_ids.is_empty(),
        "nothing to drop on a new backend"
    );
    e.run_to_completion();
    e.assert_matches_reference();
}

#[test]
fn a_request_that_cannot_grow_preempts_itself_when_last() {
    let mut e = Engine::new(config(), 6);
    // Request 2's prompt fills its blocks exactly, so its first decode needs a new one.
    e.add(request(1).prompt_len(10).max_tokens(10).ignore_eos());
    e.add(request(2).prompt_len(11).max_tokens(5).ignore_eos());
    let mut saw_self_preemption = false;
    while e.sched.has_unfinished() {
        let running_before = e.sched.num_running();
        let (out, _) = e.step();
        if out.preempted.contains(&RequestId(2)) && running_before == 2 {
            saw_self_preemption |= scheduled(&out) == vec![(1, 1)];
        }
    }
    assert!(saw_self_preemption);
    e.assert_matches_reference();
}

#[test]
fn abort_frees_blocks_in_every_state() {
    let mut e = Engine::new(
        SchedulerConfig {
            max_num_batched_tokens: 40,
            ..config()
        },
        64,
    );
    e.add(request(1).prompt_len(20).max_tokens(50).ignore_eos()); // decoding
    e.add(request(2).prompt_len(60)); // mid-prefill
    e.add(request(3)); // mid-step
    e.add(request(4).max_tokens(3)); // survives
    e.add(request(5).prompt_len(30)); // still waiting
    e.step();
    e.step();
    assert!(!e.kv.block_table(RequestId(2)).is_empty());
    assert!(e.kv.block_table(RequestId(5)).is_empty());

    let used = e.kv.usage().used_blocks;
    let held = e.kv.block_table(RequestId(2)).len();
    e.abort(RequestId(2));
    assert_eq!(e.kv.usage().used_blocks, used - held);
    e.abort(RequestId(5));
    assert!(
        !e.sched.abort_request(RequestId(5), &mut e.kv),
        "second abort is a no-op"
    );

    // Abort between schedule and update: the step's results for it are dropped.
    let out = e.schedule();
    assert!(scheduled(&out).iter().any(|&(id, _)| id == 3));
    let step = e.execute(&out);
    e.abort(RequestId(3));
    e.abort(RequestId(1));
    let updates = e.update(&out, &step);
    assert!(updates.iter().all(|u| u.id == RequestId(4)));

    e.run_to_completion();
    assert_eq!(e.finished[&RequestId(4)], FinishReason::Length);
    e.assert_matches_reference();
}

#[test]
fn finished_sequences_leave_the_batch() {
    let mut e = Engine::new(config(), 64);
    e.add(request(1).max_tokens(2).ignore_eos());
    e.add(request(2).max_tokens(6).ignore_eos());
    let mut finished_at = None;
    while e.sched.has_unfinished() {
        let (out, updates) = e.step();
        if finished_at.is_some() {
            assert_eq!(scheduled(&out), vec![(2, 1)]);
            assert_eq!(e.sched.num_running(), usize::from(e.sched.has_unfinished()));
        }
        if updates
            .iter()
            .any(|u| u.id == RequestId(1) && u.finished.is_some())
        {
            finished_at = Some(e.steps);
        }
    }
    assert_eq!(finished_at, Some(2));
    e.assert_matches_reference();
}

#[test]
fn eos_stops_unless_ignore_eos() {
    let mut e = Engine::new(config(), 64);
    e.add(request(1).max_tokens(8));
    e.add(request(2).max_tokens(8).ignore_eos());
    e.add(request(3).max_tokens(8));
    for id in 1..=2 {
        e.model.script.insert((RequestId(id), 2), EOS);
    }
    // The second eos id counts too.
    e.model.script.insert((RequestId(3), 4), EOS + 1);
    e.run_to_completion();
    assert_eq!(e.outputs[&RequestId(1)].len(), 3);
    assert_eq!(e.outputs[&RequestId(1)][2], EOS);
    assert_eq!(e.finished[&RequestId(1)], FinishReason::Stop);
    assert_eq!(e.outputs[&RequestId(2)].len(), 8);
    assert_eq!(e.finished[&RequestId(2)], FinishReason::Length);
    assert_eq!(e.outputs[&RequestId(3)].len(), 5);
    assert_eq!(e.finished[&RequestId(3)], FinishReason::Stop);
    e.assert_matches_reference();
}

#[test]
fn stop_token_ids_stop_even_with_ignore_eos() {
    let mut e = Engine::new(config(), 64);
    e.add(
        request(1)
            .max_tokens(8)
            .ignore_eos()
            .stop_token_ids(vec![7, 11]),
    );
    e.model.script.insert((RequestId(1), 3), 11);
    e.run_to_completion();
    assert_eq!(e.outputs[&RequestId(1)].len(), 4);
    assert_eq!(e.finished[&RequestId(1)], FinishReason::Stop);
    e.assert_matches_reference();
}

#[test]
fn max_tokens_wins_over_eos_on_the_last_token() {
    let mut e = Engine::new(config(), 64);
    e.add(request(1).max_tokens(3));
    e.model.script.insert((RequestId(1), 2), EOS);
    e.run_to_completion();
    assert_eq!(e.outputs[&RequestId(1)].len(), 3);
    assert_eq!(e.finished[&RequestId(1)], FinishReason::Length);
}

#[test]
fn max_model_len_ends_the_sequence_and_rejects_longer_prompts() {
    let mut e = Engine::new(
        SchedulerConfig {
            max_model_len: 20,
            ..config()
        },
        64,
    );
    e.add(request(1).prompt_len(15).max_tokens(100).ignore_eos());
    e.add(request(2).prompt_len(21));
    e.add(request(3).prompt_len(20).max_tokens(100));
    let (out, updates) = e.step();
    assert_eq!(
        out.finished_early,
        vec![(RequestId(2), FinishReason::Length)]
    );
    assert!(updates
        .iter()
        .any(|u| u.id == RequestId(2) && u.new_token_ids.is_empty()));
    e.run_to_completion();
    assert_eq!(e.outputs[&RequestId(1)].len(), 5);
    assert_eq!(e.finished[&RequestId(1)], FinishReason::Length);
    assert_eq!(e.outputs[&RequestId(3)].len(), 1);
    assert_eq!(e.finished[&RequestId(2)], FinishReason::Length);
    e.assert_matches_reference();
}

#[test]
fn finish_request_from_a_stop_string_frees_and_leaves_the_batch() {
    let mut e = Engine::new(config(), 64);
    e.add(request(1).max_tokens(30));
    e.add(request(2).max_tokens(30));
    e.step();
    e.step();
    assert!(e
        .sched
        .finish_request(RequestId(1), FinishReason::Stop, &mut e.kv));
    e.finished.insert(RequestId(1), FinishReason::Stop);
    assert!(e.kv.block_table(RequestId(1)).is_empty());
    let (out, _) = e.step();
    assert_eq!(scheduled(&out), vec![(2, 1)]);
    e.run_to_completion();
}

/// The actor's overlap: output processing of step N finishes a request (a stop string) while
/// step N+1, which includes it, runs. Its blocks are freed before that step writes into them;
/// only the next `schedule()` hands them out again, so no one's K/V is corrupted — neither a
/// prefix-cache hit on its full blocks nor the requests that get its other blocks.
#[test]
fn finishing_a_request_while_its_next_step_runs_is_kv_safe() {
    let mut e = Engine::new(config(), 16);
    let prompt = random_tokens(90, 2 * BLOCK_SIZE + 3);
    e.add(
        request(1)
            .prompt(prompt.clone())
            .max_tokens(40)
            .ignore_eos(),
    );
    e.add(request(2).max_tokens(40).ignore_eos());
    e.step();
    e.step();
    let out = e.schedule(); // step N+1, dispatched
    assert!(scheduled(&out).iter().any(|&(id, _)| id == 1));
    assert!(e
        .sched
        .finish_request(RequestId(1), FinishReason::Stop, &mut e.kv));
    // Its output was cut by the stop string: the reference check leaves it out.
    e.finished.insert(RequestId(1), FinishReason::Cancelled);
    let step = e.model.execute(&out); // writes into request 1's freed blocks
    let updates = e.update(&out, &step);
    assert!(updates.iter().all(|u| u.id != RequestId(1)));
    // A newcomer with request 1's prompt hits its cached blocks; others take the rest.
    e.add(request(3).prompt(prompt).max_tokens(20).ignore_eos());
    for id in 4..8 {
        e.add(request(id).max_tokens(20).ignore_eos());
    }
    e.run_to_completion();
    assert!(e.kv.prefix_cache_stats().hit_tokens >= 2 * BLOCK_SIZE as u64);
    e.assert_matches_reference();
}

#[test]
fn shared_prompt_prefix_is_computed_once() {
    let mut e = Engine::new(config(), 64);
    let shared = random_tokens(77, 24);
    let with_suffix = |n: u64| {
        let mut p = shared.clone();
        p.extend(random_tokens(78 + n, 5));
        p
    };
    e.add(request(1).prompt(with_suffix(1)));
    e.step();
    e.add(request(2).prompt(with_suffix(2)));
    let (out, _) = e.step();
    // 24 shared tokens are 6 cached blocks; request 2 computes only its 5-token suffix.
    assert_eq!(scheduled(&out), vec![(1, 1), (2, 5)]);
    let (t1, t2) = (
        e.kv.block_table(RequestId(1)),
        e.kv.block_table(RequestId(2)),
    );
    assert_eq!(t1[..6], t2[..6]);
    e.run_to_completion();
    assert_eq!(e.kv.prefix_cache_stats().hit_tokens, 24);
    e.assert_matches_reference();
}

#[test]
fn a_missing_sampled_token_is_recomputed() {
    let mut e = Engine::new(config(), 64);
    e.add(request(1));
    let out = e.schedule();
    let mut step = e.execute(&out);
    step.sampled.clear();
    assert!(e.update(&out, &step).is_empty());
    let (out, updates) = e.step();
    assert_eq!(scheduled(&out), vec![(1, 1)]);
    assert_eq!(out.scheduled[0].num_computed_tokens, 12);
    assert_eq!(updates[0].new_token_ids.len(), 1);
    e.run_to_completion();
    e.assert_matches_reference();
}

/// Many requests, random lengths, shared prefixes, arrivals over time, random aborts (some
/// while a step is in flight), and a KV pool far smaller than the load.
/// Returns (preemptions, prefix-cache hit tokens, emergency pauses).
/// Random arrivals, aborts and scripted eos under tight blocks; returns (preemptions, prefix-hit
/// tokens, emergency pauses, most blocks freed behind the window in one table).
fn randomized_run(seed: u64, policy: Policy, window: Option<usize>) -> (u64, u64, u64, usize) {
    let (p, h, z, f, _) = randomized_run_with(seed, policy, window, None);
    (p, h, z, f)
}

/// The KV-tier knobs of a randomized run: a host tier of `host_blocks`, `mode`, and requests
/// with `n > 1` now and then.
#[derive(Debug, Clone, Copy)]
struct TierKnobs {
    host_blocks: usize,
    mode: PreemptionMode,
    /// Copy bandwidth, bytes/s (the cost model decides against it in `auto`).
    bytes_per_s: f64,
}

/// `randomized_run`, with a host tier when `tiers` is set; also returns the engine's KV tier
/// statistics.
fn randomized_run_with(
    seed: u64,
    policy: Policy,
    window: Option<usize>,
    tiers: Option<TierKnobs>,
) -> (u64, u64, u64, usize, crate::kv::TierStats) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cfg = SchedulerConfig {
        policy,
        max_num_seqs: rng.random_range(2..12),
        max_num_batched_tokens: rng.random_range(8..96),
        max_model_len: rng.random_range(40..160),
        long_prefill_token_threshold: [0, 5, 16][rng.random_range(0..3)],
        classes: ClassConfig {
            short_below: 16,
            long_above: 40,
            long_prefill_budget: rng.random_range(4..32),
        },
        // Tight for 10 ms steps, so emergency mode comes and goes.
        slo: SloConfig {
            short: ClassSlo {
                ttft_ms: 60.0,
                itl_ms: 15.0,
                e2e_ms: f64::INFINITY,
            },
            ..SloConfig::default()
        },
        emergency: EmergencyConfig {
            window_s: 0.5,
            exit_hold_s: 0.2,
            min_samples: 5,
            eval_interval_s: 0.05,
            pause_length_factor: 1.2,
            ..EmergencyConfig::default()
        },
        merge: MergeConfig {
            expected_output_tokens: 4,
            ..MergeConfig::default()
        },
        admission: AdmissionConfig {
            early_reject: false,
            ..AdmissionConfig::default()
        },
        preemption_mode: tiers.map_or(PreemptionMode::Auto, |t| t.mode),
        ..SchedulerConfig::default()
    };
    let num_blocks = rng.random_range(12..40);
    let mut e = Engine::with_window(cfg.clone(), num_blocks, window);
    if let Some(t) = tiers {
        e.kv = KvCacheManager::new(num_blocks, BLOCK_SIZE, true)
            .with_sliding_window(window)
            .with_host_tier(t.host_blocks);
        e.sched.set_swap_cost(Some(SwapCost {
            bytes_per_block: 1 << 16,
            bytes_per_s: t.bytes_per_s,
        }));
    }
    let prefixes: Vec<Vec<u32>> = (0..3).map(|i| random_tokens(seed * 10 + i, 20)).collect();
    let num_requests = 60;
    let mut next_id = 1;
    let mut in_flight_aborts = 0;
    while next_id <= num_requests || e.sched.has_unfinished() {
        assert!(e.steps < 20_000, "no progress");
        for _ in 0..rng.random_range(0..3) {
            if next_id > num_requests {
                break;
            }
            let mut prompt = Vec::new();
            if rng.random_bool(0.5) {
                let p = &prefixes[rng.random_range(0..prefixes.len())];
                prompt.extend(&p[..rng.random_range(1..=p.len())]);
            }
            prompt.extend(random_tokens(
                seed * 1000 + next_id,
                rng.random_range(1..60),
            ));
            let mut req = request(next_id)
                .prompt(prompt)
                .max_tokens(rng.random_range(1..40));
            if rng.random_bool(0.3) {
                req = req.ignore_eos();
            }
            if tiers.is_some() && rng.random_bool(0.15) {
                req.n = rng.random_range(2..=3.min(cfg.max_num_seqs));
                // Choices diverge at once: each starts from its own token.
                for i in 0..req.n {
                    let choice = RequestId(req.id.0 + i as u64);
                    e.model.script.insert((choice, 0), RESERVED + 1 + i as u32);
                }
            }
            for i in 0..req.n {
                if rng.random_bool(0.2) {
                    let choice = RequestId(req.id.0 + i as u64);
                    e.model
                        .script
                        .insert((choice, rng.random_range(0..20)), EOS);
                }
            }
            next_id += req.n as u64;
            e.add(req);
        }
        let out = e.schedule();
        let step = e.execute(&out);
        if rng.random_bool(0.03) && !out.scheduled.is_empty() {
            let id = out.scheduled[rng.random_range(0..out.scheduled.len())].id;
            e.abort(id);
            in_flight_aborts += 1;
        }
        e.update(&out, &step);
        if rng.random_bool(0.01) {
            let mut live: Vec<RequestId> = e
                .requests
                .keys()
                .filter(|id| !e.finished.contains_key(id) && e.sched.is_known(**id))
                .copied()
                .collect();
            live.sort();
            if !live.is_empty() {
                e.abort(live[rng.random_range(0..live.len())]);
            }
        }
    }
    e.assert_no_leaks();
    assert_eq!(e.finished.len(), e.requests.len());
    assert!(in_flight_aborts > 0);
    e.assert_matches_reference();
    (
        e.sched.num_preemptions(),
        e.kv.prefix_cache_stats().hit_tokens,
        e.sched.stats().emergency_pauses,
        e.max_freed,
        e.kv.tier_stats(),
    )
}

#[test]
fn randomized_load_with_aborts_keeps_invariants() {
    let (mut preemptions, mut hits) = (0, 0);
    for seed in 1..=24 {
        let (p, h, _, _) = randomized_run(seed, Policy::Fcfs, None);
        preemptions += p;
        hits += h;
    }
    // The load is meant to exercise both; a change that stops it would weaken the test.
    assert!(
        preemptions > 0 && hits > 0,
        "preemptions {preemptions}, hit tokens {hits}"
    );
}

#[test]
fn randomized_load_with_aborts_keeps_invariants_adaptive() {
    let (mut preemptions, mut hits, mut pauses) = (0, 0, 0);
    for seed in 1..=24 {
        let (p, h, z, _) = randomized_run(seed, Policy::Adaptive, None);
        preemptions += p;
        hits += h;
        pauses += z;
    }
    assert!(
        preemptions > pauses && hits > 0 && pauses > 0,
        "preemptions {preemptions}, hit tokens {hits}, pauses {pauses}"
    );
}
