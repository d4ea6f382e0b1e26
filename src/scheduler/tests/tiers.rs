//! The KV memory tier through the scheduler: preemption by swap or recompute (by cost, or
//! forced), resuming swapped requests, prefix hits in the host tier, aborts in every tier
//! state, and `n > 1` forks with copy-on-write. The fake model's slots follow every copy the
//! steps carry (`FakeModel::copy_blocks`), so a wrong or missing copy changes the output, which
//! must equal the plain reference decode of each request (each choice alone).

use super::*;
use crate::step::CopyKind;

/// Copies that cost nothing next to recomputing: `auto` swaps.
fn fast() -> SwapCost {
    SwapCost {
        bytes_per_block: 1 << 16,
        bytes_per_s: 1e15,
    }
}

/// Copies so slow that recomputing always wins.
fn slow() -> SwapCost {
    SwapCost {
        bytes_per_block: 1 << 16,
        bytes_per_s: 1.0,
    }
}

fn with_mode(mode: PreemptionMode) -> SchedulerConfig {
    SchedulerConfig {
        preemption_mode: mode,
        ..config()
    }
}

/// Two requests that need 16 blocks together, in 12: request 2 is preempted.
fn two_long(e: &mut Engine) {
    e.add(request(1).prompt_len(8).max_tokens(24).ignore_eos());
    e.add(request(2).prompt_len(8).max_tokens(24).ignore_eos());
}

#[test]
fn a_swapped_request_resumes_where_it_stopped() {
    let mut e = Engine::with_host(with_mode(PreemptionMode::Swap), 12, 32, slow());
    two_long(&mut e);
    let (mut swapped_at, mut resumed) = (None, false);
    while e.sched.has_unfinished() {
        let (out, _) = e.step();
        if out.preempted.contains(&RequestId(2)) {
            let outputs = e.outputs.get(&RequestId(2)).map_or(0, Vec::len);
            swapped_at = Some(outputs);
            assert!(out
                .kv_copies
                .iter()
                .any(|c| c.kind == CopyKind::DeviceToHost));
        }
        if out.loading.contains(&RequestId(2)) {
            // Its copies back run under this step's forward (no block of them is read in it).
            assert!(out.kv_copies[out.kv_copies_for_forward..]
                .iter()
                .any(|c| c.kind == CopyKind::HostToDevice));
            // Loading: its blocks come back in this step, it computes nothing in it.
            assert!(out.scheduled.iter().all(|s| s.id != RequestId(2)));
            let next = e.schedule();
            let s = next
                .scheduled
                .iter()
                .find(|s| s.id == RequestId(2))
                .unwrap();
            // It goes on from where it stopped: a decode, not a recompute.
            assert_eq!(s.num_tokens, 1);
            assert!(s.new.is_some(), "the executor dropped it at the preemption");
            e.execute_and_update(&next);
            resumed = true;
        }
    }
    assert!(swapped_at.is_some() && resumed);
    assert_eq!(e.sched.stats().preempt_count(PreemptDecision::Swap), 1);
    assert_eq!(e.kv.tier_stats().swapped_in_requests, 1);
    e.assert_no_leaks();
    e.assert_matches_reference();
}

#[test]
fn auto_swaps_when_copying_is_cheaper_and_recomputes_when_not() {
    for (cost, want) in [
        (fast(), PreemptDecision::Swap),
        (slow(), PreemptDecision::Recompute),
    ] {
        let mut e = Engine::with_host(with_mode(PreemptionMode::Auto), 12, 32, cost);
        two_long(&mut e);
        e.run_to_completion();
        e.assert_matches_reference();
        let st = e.sched.stats();
        assert!(st.preempt_count(want) > 0, "{cost:?}: {st:?}");
        assert_eq!(st.preempt_count(want), e.sched.num_preemptions());
    }
}

#[test]
fn recompute_mode_never_swaps_and_no_host_tier_says_so() {
    let mut e = Engine::with_host(with_mode(PreemptionMode::Recompute), 12, 32, fast());
    two_long(&mut e);
    e.run_to_completion();
    e.assert_matches_reference();
    assert_eq!(e.kv.tier_stats().swapped_out_requests, 0);
    let mut plain = Engine::new(config(), 12);
    two_long(&mut plain);
    plain.run_to_completion();
    let st = plain.sched.stats();
    assert_eq!(
        st.preempt_count(PreemptDecision::RecomputeNoHost),
        plain.sched.num_preemptions()
    );
}

#[test]
fn a_full_host_tier_falls_back_to_recompute() {
    // Two host blocks: request 2's table (5 blocks or more) never fits.
    let mut e = Engine::with_host(with_mode(PreemptionMode::Swap), 12, 2, fast());
    two_long(&mut e);
    e.run_to_completion();
    e.assert_matches_reference();
    let st = e.sched.stats();
    assert!(st.preempt_count(PreemptDecision::RecomputeHostFull) > 0);
    assert_eq!(st.preempt_count(PreemptDecision::Swap), 0);
    assert_eq!(e.finished[&RequestId(2)], FinishReason::Length);
}

#[test]
fn prefix_blocks_evicted_to_the_host_are_hit_and_loaded_back() {
    let mut e = Engine::with_host(config(), 10, 32, fast());
    let prompt = random_tokens(7, 25);
    e.add(request(1).prompt(prompt.clone()).max_tokens(2).ignore_eos());
    e.run_to_completion();
    // Another prompt takes every device block: request 1's cached blocks go to the host.
    e.add(request(2).prompt_len(36).max_tokens(2).ignore_eos());
    e.run_to_completion();
    assert!(e.kv.tier_stats().offloaded_blocks >= 6);
    e.add(request(3).prompt(prompt).max_tokens(3).ignore_eos());
    let (out, _) = e.step();
    assert_eq!(out.loading, vec![RequestId(3)]);
    assert!(out.scheduled.is_empty());
    assert_eq!(
        out.kv_copies
            .iter()
            .filter(|c| c.kind == CopyKind::HostToDevice)
            .count(),
        6
    );
    let (out, _) = e.step();
    // Only the last prompt token is left to compute.
    assert_eq!(scheduled(&out), vec![(3, 1)]);
    e.run_to_completion();
    e.assert_matches_reference();
    assert_eq!(e.kv.prefix_cache_stats().host_hit_tokens, 24);
}

#[test]
fn host_hits_are_recomputed_when_copying_costs_more() {
    let mut e = Engine::with_host(config(), 10, 32, slow());
    let prompt = random_tokens(7, 25);
    e.add(request(1).prompt(prompt.clone()).max_tokens(2).ignore_eos());
    e.run_to_completion();
    e.add(request(2).prompt_len(36).max_tokens(2).ignore_eos());
    e.run_to_completion();
    e.add(request(3).prompt(prompt).max_tokens(3).ignore_eos());
    let (out, _) = e.step();
    assert!(out.loading.is_empty());
    assert_eq!(scheduled(&out), vec![(3, 25)]);
    e.run_to_completion();
    e.assert_matches_reference();
}

#[test]
fn aborts_while_swapped_or_loading_leak_nothing_in_either_tier() {
    for abort_when_loading in [false, true] {
        let mut e = Engine::with_host(with_mode(PreemptionMode::Swap), 12, 32, slow());
        two_long(&mut e);
        let mut aborted = false;
        while e.sched.has_unfinished() {
            let out = e.schedule();
            let step = e.execute(&out);
            let hit = if abort_when_loading {
                out.loading.contains(&RequestId(2))
            } else {
                out.preempted.contains(&RequestId(2))
            };
            if hit && !aborted {
                // The step carrying its copies has run but not come back (a disconnect
                // during the swap).
                e.abort(RequestId(2));
                assert!(!e.kv.is_swapped(RequestId(2)));
                aborted = true;
            }
            e.update(&out, &step);
        }
        assert!(aborted, "loading {abort_when_loading}");
        e.assert_no_leaks();
        assert_eq!(e.kv.host_usage().unwrap().used_blocks, 0);
        e.assert_matches_reference();
    }
}

#[test]
fn n_choices_fork_the_prompt_blocks_and_copy_the_partial_one() {
    let mut e = Engine::new(config(), 64);
    // 14 prompt tokens: 13 computed before the fork, the 4th block (12..16) is partial.
    let mut req = request(10).prompt_len(14).max_tokens(5).ignore_eos();
    req.n = 3;
    for i in 0..3 {
        e.model
            .script
            .insert((RequestId(10 + i), 0), RESERVED + 1 + i as u32);
    }
    e.add(req);
    let (out, updates) = e.step();
    assert_eq!(
        scheduled(&out),
        vec![(10, 13)],
        "the prefill stops one token short"
    );
    assert!(updates.is_empty());
    let parent_table = e.kv.block_table(RequestId(10)).to_vec();
    let (out, _) = e.step();
    // Forked: every choice computes the last prompt token itself, with its own stream.
    assert_eq!(scheduled(&out), vec![(10, 1), (11, 1), (12, 1)]);
    assert!(out.scheduled.iter().all(|s| s.new.is_some() && s.sample));
    assert_eq!(out.finished_req_ids, vec![RequestId(10)]);
    let cows: Vec<_> = out
        .kv_copies
        .iter()
        .filter(|c| c.kind == CopyKind::DeviceToDevice)
        .collect();
    assert_eq!(cows.len(), 2, "two of three writers copy the shared block");
    // Full prompt blocks stay shared by all three.
    for b in &parent_table[..3] {
        assert_eq!(e.kv.pool().ref_count(*b), 3);
    }
    assert_eq!(e.kv.block_table(RequestId(10))[..3], parent_table[..3]);
    e.run_to_completion();
    e.assert_matches_reference();
    let outs: Vec<&Vec<u32>> = (10..13).map(|i| &e.outputs[&RequestId(i)]).collect();
    assert!(outs[0] != outs[1] && outs[1] != outs[2], "choices diverge");
}

#[test]
fn n_choices_with_greedy_sampling_give_the_same_tokens() {
    let mut e = Engine::new(config(), 64);
    let mut req = request(20).prompt_len(9).max_tokens(6).ignore_eos();
    req.n = 4;
    e.add(req);
    e.run_to_completion();
    e.assert_matches_reference();
    let first = &e.outputs[&RequestId(20)];
    for i in 21..24 {
        assert_eq!(&e.outputs[&RequestId(i)], first);
    }
}

#[test]
fn a_one_token_prompt_with_n_choices_runs_them_apart() {
    let mut e = Engine::new(config(), 64);
    let mut req = request(30).prompt_len(1).max_tokens(4).ignore_eos();
    req.n = 2;
    e.add(req);
    let (out, _) = e.step();
    assert_eq!(scheduled(&out), vec![(30, 1), (31, 1)]);
    e.run_to_completion();
    e.assert_matches_reference();
}

#[test]
fn n_choices_hold_their_slots_from_admission() {
    let mut e = Engine::new(
        SchedulerConfig {
            max_num_seqs: 3,
            ..config()
        },
        64,
    );
    let mut req = request(40).prompt_len(20).max_tokens(3).ignore_eos();
    req.n = 3;
    e.add(req);
    e.add(request(50).max_tokens(2));
    let (out, _) = e.step();
    assert_eq!(
        scheduled(&out),
        vec![(40, 19)],
        "the third slot is the choices'"
    );
    e.run_to_completion();
    e.assert_matches_reference();
}

#[test]
fn randomized_load_with_a_host_tier_forks_and_swaps_keeps_invariants() {
    for policy in [Policy::Fcfs, Policy::Adaptive] {
        for (mode, bytes_per_s) in [
            (PreemptionMode::Swap, 1e15),
            (PreemptionMode::Auto, 1e9),
            (PreemptionMode::Auto, 1.0),
        ] {
            let mut totals = crate::kv::TierStats::default();
            let mut preemptions = 0;
            for seed in 1..=10 {
                let knobs = TierKnobs {
                    host_blocks: [4, 16, 64][seed as usize % 3],
                    mode,
                    bytes_per_s,
                };
                let window = (seed % 4 == 0).then_some(9);
                let (p, _, _, _, st) = randomized_run_with(seed, policy, window, Some(knobs));
                preemptions += p;
                totals.swapped_in_requests += st.swapped_in_requests;
                totals.cow_blocks += st.cow_blocks;
                totals.offloaded_blocks += st.offloaded_blocks;
                totals.swap_in_blocks += st.swap_in_blocks;
            }
            assert!(
                preemptions > 0 && totals.cow_blocks > 0,
                "{policy:?} {mode:?}"
            );
            assert!(totals.offloaded_blocks > 0, "{policy:?} {mode:?}");
            if bytes_per_s >= 1e9 {
                assert!(totals.swap_in_blocks > 0, "{policy:?} {mode:?}: {totals:?}");
            } else {
                // Copying back always costs more than computing: nothing comes back.
                assert_eq!(totals.swap_in_blocks, 0, "{policy:?}: {totals:?}");
                assert_eq!(totals.swapped_in_requests, 0, "{policy:?}: {totals:?}");
            }
            if mode == PreemptionMode::Swap {
                assert!(totals.swapped_in_requests > 0, "{policy:?}: {totals:?}");
            }
        }
    }
}

/// A backend rebuilt after a panic takes its host tier with it: the running request and the
/// swapped-out one both go back to recompute (no swap-in of host blocks that are gone), the
/// reset leaves nothing cached or held in either tier, and both still produce the reference
/// tokens.
#[test]
fn a_lost_executor_recomputes_swapped_requests_and_clears_both_tiers() {
    let mut e = Engine::with_host(with_mode(PreemptionMode::Swap), 12, 32, slow());
    two_long(&mut e);
    while !e.kv.is_swapped(RequestId(2)) {
        assert!(e.sched.has_unfinished(), "request 2 was never swapped out");
        e.step();
    }
    assert_eq!(e.sched.executor_lost(&mut e.kv), 1);
    assert!(!e.kv.is_swapped(RequestId(2)));
    e.kv.reset_prefix_cache();
    e.model = FakeModel::new(12, None);
    let host = e.kv.host_usage().unwrap();
    assert_eq!((host.used_blocks, host.cached_blocks), (0, 0));
    assert_eq!(e.kv.usage().used_blocks, 0);
    assert_eq!((e.sched.num_running(), e.sched.num_waiting()), (0, 2));
    e.check();
    let swapped_in = e.kv.tier_stats().swapped_in_requests;
    while e.sched.has_unfinished() {
        e.step();
    }
    assert_eq!(
        e.kv.tier_stats().swapped_in_requests,
        swapped_in,
        "nothing is swapped back in from the lost host tier"
    );
    e.assert_no_leaks();
    e.assert_matches_reference();
}
