//! Sliding-window models: the KV manager frees blocks behind the window, the scheduler reports
//! them by count (`ScheduledRequest::num_freed_blocks`), and the executor's persistent tables
//! and their device mirror follow (the harness compares them with the KV manager's table and
//! fails on any read of a freed block). Output must equal the windowed reference decode.

use super::*;

#[test]
fn long_decodes_free_blocks_behind_the_window_in_the_executor_too() {
    // Window 6 over blocks of 4: three requests of 73 tokens each run side by side in a pool of
    // 20 blocks, without a preemption; under full attention they would need 57.
    let mut e = Engine::with_window(
        SchedulerConfig {
            max_model_len: 80,
            ..config()
        },
        20,
        Some(6),
    );
    for id in 1..=3 {
        e.add(request(id).ignore_eos().max_tokens(60));
    }
    e.run_to_completion();
    e.assert_matches_reference();
    for id in 1..=3 {
        assert_eq!(e.outputs[&RequestId(id)].len(), 60);
    }
    assert_eq!(e.sched.num_preemptions(), 0);
    assert!(e.max_freed >= 15, "freed {}", e.max_freed);
}

#[test]
fn randomized_load_with_a_sliding_window_keeps_invariants() {
    for policy in [Policy::Fcfs, Policy::Adaptive] {
        let (mut preemptions, mut freed) = (0, 0);
        for seed in 1..=12 {
            let window = [3, 6, 9, 17][seed as usize % 4];
            let (p, _, _, f) = randomized_run(seed, policy, Some(window));
            preemptions += p;
            freed = freed.max(f);
        }
        assert!(
            preemptions > 0 && freed > 2,
            "{policy:?}: preemptions {preemptions}, most freed {freed}"
        );
    }
}
