//! InputBatch against hand-written step sequences. The scheduler tests run it under randomized
//! load (preemptions, aborts, prefix hits) through their fake executor, against a reference.

use std::sync::Arc;

use super::*;
use crate::sampling::sampler::TokenCounts;
use crate::step::{SampledToken, ScheduledRequest};

const BS: usize = 4;

fn new_req(id: u64, tokens: Vec<u32>, blocks: Vec<u32>, n: usize) -> ScheduledRequest {
    let params = Arc::new(SamplingParams::greedy(8));
    ScheduledRequest::first(id, tokens, n, blocks, params, 100 + id)
}

fn cached(id: u64, computed: usize, n: usize, sample: bool, blocks: Vec<u32>) -> ScheduledRequest {
    ScheduledRequest::running(id, computed, n, sample, blocks)
}

fn step(scheduled: Vec<ScheduledRequest>) -> SchedulerOutput {
    SchedulerOutput {
        scheduled,
        ..SchedulerOutput::default()
    }
}

fn sampled(pairs: &[(u64, u32)]) -> StepOutput {
    StepOutput {
        sampled: pairs
            .iter()
            .map(|&(id, token)| SampledToken {
                request_id: RequestId(id),
                token,
                logprob: 0.0,
            })
            .collect(),
        elapsed: std::time::Duration::ZERO,
        ..StepOutput::default()
    }
}

/// The table entries a device mirror would hold after applying every drained change.
fn apply_changes(ib: &mut InputBatch, mirror: &mut Vec<Vec<u32>>) {
    ib.drain_table_changes(|r, c, id| {
        if mirror.len() <= r {
            mirror.resize(r + 1, Vec::new());
        }
        if mirror[r].len() <= c {
            mirror[r].resize(c + 1, u32::MAX);
        }
        mirror[r][c] = id;
    });
}

fn assert_mirror(ib: &InputBatch, mirror: &[Vec<u32>]) {
    assert!(mirror.len() >= ib.len());
    for (r, dev) in mirror.iter().enumerate().take(ib.len()) {
        let host = ib.batch().block_tables.row(r);
        assert_eq!(&dev[..host.len()], host, "row {r}");
    }
}

#[test]
fn new_request_then_decodes_carry_only_diffs() {
    let mut ib = InputBatch::new(BS, 16, 8);
    let b = ib
        .update(&step(vec![new_req(
            1,
            vec![10, 11, 12, 13, 14],
            vec![3, 7],
            5,
        )]))
        .unwrap();
    assert_eq!(b.token_ids, vec![10, 11, 12, 13, 14]);
    assert_eq!(b.positions, vec![0, 1, 2, 3, 4]);
    assert_eq!(b.slot_mapping, vec![12, 13, 14, 15, 28]);
    let s = &b.seqs[0];
    assert_eq!((s.row, s.query_len, s.context_len), (0, 5, 5));
    let smp = s.sample.as_ref().unwrap();
    assert_eq!((smp.seed, smp.output_index), (101, 0));
    ib.record(&sampled(&[(1, 99)])).unwrap();

    // The decode carries no tokens: the executor feeds back the one it sampled.
    let b = ib
        .update(&step(vec![cached(1, 5, 1, true, vec![])]))
        .unwrap();
    assert_eq!(
        (b.token_ids.clone(), b.positions.clone()),
        (vec![99], vec![5])
    );
    assert_eq!(b.slot_mapping, vec![29]);
    assert_eq!(b.seqs[0].sample.as_ref().unwrap().output_index, 1);
    ib.record(&sampled(&[(1, 98)])).unwrap();
    ib.update(&step(vec![cached(1, 6, 1, true, vec![])]))
        .unwrap();
    ib.record(&sampled(&[(1, 97)])).unwrap();
    // Position 8 needs a third block: the step appends it.
    let b = ib
        .update(&step(vec![cached(1, 7, 1, true, vec![5])]))
        .unwrap();
    assert_eq!(b.block_table(&b.seqs[0]), &[3, 7, 5]);
    assert_eq!(b.slot_mapping, vec![31]);
    assert_eq!(
        ib.tokens(RequestId(1)).unwrap(),
        &[10, 11, 12, 13, 14, 99, 98, 97]
    );
}

#[test]
fn chunked_prefill_samples_only_at_the_end() {
    let mut ib = InputBatch::new(BS, 16, 8);
    let prompt: Vec<u32> = (0..10).collect();
    let b = ib
        .update(&step(vec![new_req(1, prompt, vec![0, 1], 6)]))
        .unwrap();
    assert!(b.seqs[0].sample.is_none());
    ib.record(&sampled(&[])).unwrap();
    let b = ib
        .update(&step(vec![cached(1, 6, 4, true, vec![2])]))
        .unwrap();
    assert_eq!(b.token_ids, vec![6, 7, 8, 9]);
    assert_eq!(b.positions, vec![6, 7, 8, 9]);
    assert_eq!(b.seqs[0].sample.as_ref().unwrap().output_index, 0);
}

#[test]
fn a_dropped_row_is_filled_by_the_last_and_the_mirror_follows() {
    let mut ib = InputBatch::new(BS, 32, 8).track_table_changes();
    let mut mirror = Vec::new();
    ib.update(&step(vec![
        new_req(1, vec![1; 3], vec![1], 3),
        new_req(2, vec![2; 5], vec![2, 3], 5),
        new_req(3, vec![3; 6], vec![4, 5], 6),
    ]))
    .unwrap();
    apply_changes(&mut ib, &mut mirror);
    assert_mirror(&ib, &mirror);
    ib.record(&sampled(&[(1, 11), (2, 12), (3, 13)])).unwrap();

    // Request 1 finished: request 3 moves into row 0, whose whole table is resent.
    let mut out = step(vec![
        cached(2, 5, 1, true, vec![]),
        cached(3, 6, 1, true, vec![]),
    ]);
    out.finished_req_ids = vec![RequestId(1)];
    ib.update(&out).unwrap();
    assert_eq!(ib.len(), 2);
    let b = ib.batch();
    assert_eq!((b.seqs[0].row, b.seqs[1].row), (1, 0));
    assert_eq!(b.token_ids, vec![12, 13]);
    let mut changes = Vec::new();
    ib.drain_table_changes(|r, c, id| changes.push((r, c, id)));
    assert_eq!(changes, vec![(0, 0, 4), (0, 1, 5)]);
    mirror[0] = vec![4, 5];
    assert_mirror(&ib, &mirror);

    // Only appended entries after that.
    ib.record(&sampled(&[(2, 22), (3, 23)])).unwrap();
    ib.update(&step(vec![
        cached(2, 6, 1, true, vec![]),
        cached(3, 7, 1, true, vec![6]),
    ]))
    .unwrap();
    let mut changes = Vec::new();
    ib.drain_table_changes(|r, c, id| changes.push((r, c, id)));
    assert_eq!(changes, vec![(0, 2, 6)]);
    assert!(!ib.contains(RequestId(1)));
}

#[test]
fn a_preempted_request_comes_back_whole_in_a_fresh_row() {
    let mut ib = InputBatch::new(BS, 32, 8);
    ib.update(&step(vec![new_req(1, vec![5; 4], vec![1], 4)]))
        .unwrap();
    ib.record(&sampled(&[(1, 40)])).unwrap();
    let mut out = step(vec![]);
    out.preempted = vec![RequestId(1)];
    ib.update(&out).unwrap();
    assert!(ib.is_empty());
    // Resumed: prompt and output so far, a prefix hit of one block, new blocks.
    let mut resumed = new_req(1, vec![5, 5, 5, 5, 40], vec![1, 9], 1);
    resumed.num_computed_tokens = 4;
    resumed.sample = true;
    resumed.new.as_mut().unwrap().num_prompt_tokens = 4;
    let b = ib.update(&step(vec![resumed])).unwrap();
    assert_eq!(
        (b.token_ids.clone(), b.positions.clone()),
        (vec![40], vec![4])
    );
    assert_eq!(b.slot_mapping, vec![36]);
    assert_eq!(b.seqs[0].sample.as_ref().unwrap().output_index, 1);
}

#[test]
fn a_token_the_scheduler_did_not_keep_is_dropped() {
    let mut ib = InputBatch::new(BS, 16, 8);
    ib.update(&step(vec![new_req(1, vec![1, 2, 3], vec![0], 3)]))
        .unwrap();
    ib.record(&sampled(&[(1, 50)])).unwrap();
    // The scheduler lost that token: it recomputes position 2 and samples again.
    let b = ib
        .update(&step(vec![cached(1, 2, 1, true, vec![])]))
        .unwrap();
    assert_eq!(b.token_ids, vec![3]);
    assert_eq!(ib.tokens(RequestId(1)).unwrap(), &[1, 2, 3]);
}

#[test]
fn inconsistent_diffs_are_errors_naming_the_request() {
    let err = |ib: &mut InputBatch, s: SchedulerOutput| ib.update(&s).unwrap_err().to_string();
    let mut ib = InputBatch::new(BS, 16, 4);
    assert!(err(&mut ib, step(vec![cached(7, 0, 1, true, vec![0])])).contains("req-7"));
    ib.update(&step(vec![new_req(1, vec![1, 2, 3], vec![0], 3)]))
        .unwrap();
    let e = err(&mut ib, step(vec![new_req(1, vec![1], vec![1], 1)]));
    assert!(e.contains("holds it"), "{e}");
    // Tokens the executor does not have (its sampled token was never recorded).
    let e = err(&mut ib, step(vec![cached(1, 3, 1, true, vec![])]));
    assert!(e.contains("executor holds 3"), "{e}");
    let e = err(&mut ib, step(vec![cached(1, 0, 3, false, vec![])]));
    assert!(e.contains("sample: false"), "{e}");
    let e = err(&mut ib, step(vec![cached(1, 0, 0, true, vec![])]));
    assert!(e.contains("no tokens"), "{e}");
    let e = err(&mut ib, step(vec![new_req(2, vec![1], vec![16], 1)]));
    assert!(e.contains("outside the pool"), "{e}");
    let e = err(&mut ib, step(vec![new_req(3, vec![1; 9], vec![1], 9)]));
    assert!(e.contains("do not cover"), "{e}");
    let e = err(
        &mut ib,
        step(vec![new_req(4, vec![1], vec![1, 2, 3, 4, 5], 1)]),
    );
    assert!(e.contains("exceed"), "{e}");
    assert!(ib.record(&sampled(&[(9, 1)])).is_err());
    let mut ib = InputBatch::new(BS, 16, 4);
    ib.update(&step(vec![new_req(1, vec![1, 2, 3], vec![0], 2)]))
        .unwrap();
    let e = err(
        &mut ib,
        step(vec![
            cached(1, 2, 1, true, vec![]),
            cached(1, 2, 1, true, vec![]),
        ]),
    );
    assert!(e.contains("twice"), "{e}");
}

/// A request with penalties (frequency 0.5) and `tokens` as its prompt.
fn new_penalized(id: u64, tokens: Vec<u32>, blocks: Vec<u32>) -> ScheduledRequest {
    let mut s = new_req(id, tokens, blocks, 0);
    s.num_tokens = s.new.as_ref().unwrap().token_ids.len();
    s.sample = true;
    let new = s.new.as_mut().unwrap();
    new.params = Arc::new(SamplingParams {
        frequency_penalty: 0.5,
        ..SamplingParams::greedy(8)
    });
    s
}

const VOCAB: usize = 64;
const PROMPT_BIT: u32 = 1 << 31;

/// A device's counts as the CUDA backend keeps them: ops applied in order, and the sampler's
/// own count of each token it samples for a row with penalties.
struct CountMirror(Vec<Vec<u32>>);

impl CountMirror {
    fn apply(&mut self, ib: &mut InputBatch) {
        let rows = &mut self.0;
        ib.drain_count_ops(|op| {
            let need = match op {
                CountOp::Move { from, to } => from.max(to),
                CountOp::Clear { row } | CountOp::Prompt { row, .. } | CountOp::Add { row, .. } => {
                    row
                }
            };
            if rows.len() <= need {
                rows.resize(need + 1, vec![0xdead; VOCAB]);
            }
            match op {
                CountOp::Move { from, to } => rows[to] = rows[from].clone(),
                CountOp::Clear { row } => rows[row] = vec![0; VOCAB],
                CountOp::Prompt { row, token } => rows[row][token as usize] |= PROMPT_BIT,
                CountOp::Add { row, token, delta } => {
                    let c = &mut rows[row][token as usize];
                    *c = c.wrapping_add(delta as u32);
                }
            }
        });
    }

    fn sampled(&mut self, ib: &InputBatch, out: &StepOutput) {
        for s in &out.sampled {
            let row = ib.index[&s.request_id];
            if ib.rows[row].params.has_penalties() {
                self.0[row][s.token as usize] += 1;
            }
        }
    }
}

/// Every held request with penalties: its counts (host or mirrored) are its tokens' counts.
fn check_counts(ib: &InputBatch, mirror: Option<&CountMirror>) {
    for (r, row) in ib.rows.iter().enumerate() {
        let (prompt, output) = row.tokens.split_at(row.num_prompt);
        if !row.params.has_penalties() {
            assert!(ib.counts(r).is_none());
            continue;
        }
        match mirror {
            None => assert_eq!(
                ib.counts(r),
                Some(&TokenCounts::new(prompt, output)),
                "row {r}"
            ),
            Some(m) => {
                let mut want = vec![0u32; VOCAB];
                prompt.iter().for_each(|&t| want[t as usize] |= PROMPT_BIT);
                output.iter().for_each(|&t| want[t as usize] += 1);
                assert_eq!(m.0[r], want, "row {r} ({})", row.id);
            }
        }
    }
}

#[test]
fn penalty_counts_follow_tokens_rows_trims_and_preemption() {
    for device in [false, true] {
        let mut ib = InputBatch::new(BS, 32, 8);
        if device {
            ib = ib.track_counts_on_device();
        }
        let mut mirror = CountMirror(Vec::new());
        let mut run = |ib: &mut InputBatch, s: SchedulerOutput, toks: &[(u64, u32)]| {
            ib.update(&s).unwrap();
            mirror.apply(ib);
            let out = sampled(toks);
            if device {
                mirror.sampled(ib, &out);
            }
            ib.record(&out).unwrap();
            check_counts(ib, device.then_some(&mirror));
        };
        run(
            &mut ib,
            step(vec![
                new_penalized(1, vec![1, 2, 3], vec![0, 5]),
                new_req(2, vec![4, 5], vec![1], 2),
                new_penalized(3, vec![6, 6, 7], vec![2, 6]),
            ]),
            &[(1, 10), (2, 11), (3, 12)],
        );
        run(
            &mut ib,
            step(vec![
                cached(1, 3, 1, true, vec![]),
                cached(2, 2, 1, true, vec![]),
                cached(3, 3, 1, true, vec![]),
            ]),
            &[(1, 10), (2, 13), (3, 6)],
        );
        // Request 2 ends (request 3 moves into its row); request 1's last token was not kept.
        let mut s = step(vec![
            cached(1, 3, 1, true, vec![]),
            cached(3, 4, 1, true, vec![]),
        ]);
        s.finished_req_ids = vec![RequestId(2)];
        run(&mut ib, s, &[(1, 20), (3, 21)]);
        assert_eq!(ib.tokens(RequestId(1)).unwrap(), &[1, 2, 3, 10, 20]);
        // Request 1 is preempted and comes back whole: prompt and output.
        let mut s = step(vec![cached(3, 5, 1, true, vec![])]);
        s.preempted = vec![RequestId(1)];
        run(&mut ib, s, &[(3, 12)]);
        let mut back = new_penalized(1, vec![1, 2, 3, 10, 20], vec![3, 4]);
        back.new.as_mut().unwrap().num_prompt_tokens = 3;
        run(&mut ib, step(vec![back]), &[(1, 10)]);
        if device {
            // Device counts lost (a failed step): recounted from the rows' tokens.
            mirror.0.iter_mut().for_each(|r| r.fill(0x5555));
            ib.recount_all();
            mirror.apply(&mut ib);
            check_counts(&ib, Some(&mirror));
        }
    }
}

/// `s` with `n` leading blocks freed behind the sliding window.
fn freed(mut s: ScheduledRequest, n: usize) -> ScheduledRequest {
    s.num_freed_blocks = n;
    s
}

#[test]
fn blocks_freed_behind_the_window_become_null_here_and_on_the_mirror() {
    // Window 6, blocks of 4: the query at position p sees p-5..=p. Request 2 holds row 0,
    // request 1 row 1.
    let mut ib = InputBatch::new(BS, 32, 8)
        .with_sliding_window(Some(6))
        .track_table_changes();
    let mut mirror = Vec::new();
    ib.update(&step(vec![
        new_req(2, vec![2; 2], vec![9], 2),
        new_req(1, vec![1; 9], vec![3, 7, 5], 9),
    ]))
    .unwrap();
    apply_changes(&mut ib, &mut mirror);
    ib.record(&sampled(&[(2, 12), (1, 11)])).unwrap();

    // Position 9 sees 4..=9: block 0 was freed. Only that entry changes.
    let b = ib
        .update(&step(vec![
            freed(cached(1, 9, 1, true, vec![]), 1),
            cached(2, 2, 1, true, vec![]),
        ]))
        .unwrap();
    assert_eq!(b.block_table(&b.seqs[0]), &[NULL_BLOCK, 7, 5]);
    assert_eq!(b.slot_mapping, vec![21, 38]);
    let mut changes = Vec::new();
    ib.drain_table_changes(|r, c, id| changes.push((r, c, id)));
    assert_eq!(changes, vec![(1, 0, NULL_BLOCK)]);
    mirror[1][0] = NULL_BLOCK;
    assert_mirror(&ib, &mirror);
    ib.record(&sampled(&[(1, 21), (2, 22)])).unwrap();

    // The same count again changes nothing; a step may free and append at once.
    for (pos, token) in [(10, 31), (11, 41)] {
        ib.update(&step(vec![freed(cached(1, pos, 1, true, vec![]), 1)]))
            .unwrap();
        ib.record(&sampled(&[(1, token)])).unwrap();
    }
    ib.update(&step(vec![freed(cached(1, 12, 1, true, vec![6]), 1)]))
        .unwrap();
    ib.record(&sampled(&[(1, 51)])).unwrap();
    let mut changes = Vec::new();
    ib.drain_table_changes(|r, c, id| changes.push((r, c, id)));
    assert_eq!(changes, vec![(1, 3, 6)]);
    mirror[1].push(6);
    let b = ib
        .update(&step(vec![freed(cached(1, 13, 1, true, vec![2]), 2)]))
        .unwrap();
    assert_eq!(
        b.block_table(&b.seqs[0]),
        &[NULL_BLOCK, NULL_BLOCK, 5, 6, 2]
    );
    let mut changes = Vec::new();
    ib.drain_table_changes(|r, c, id| changes.push((r, c, id)));
    assert_eq!(changes, vec![(1, 1, NULL_BLOCK), (1, 4, 2)]);
    mirror[1][1] = NULL_BLOCK;
    mirror[1].push(2);
    assert_mirror(&ib, &mirror);
    ib.record(&sampled(&[(1, 61)])).unwrap();

    // Request 2 ends: request 1 moves into row 0, freed entries included.
    let mut out = step(vec![freed(cached(1, 14, 1, true, vec![]), 2)]);
    out.finished_req_ids = vec![RequestId(2)];
    let b = ib.update(&out).unwrap();
    assert_eq!(b.seqs[0].row, 0);
    let mut changes = Vec::new();
    ib.drain_table_changes(|r, c, id| changes.push((r, c, id)));
    assert_eq!(
        changes,
        vec![
            (0, 0, NULL_BLOCK),
            (0, 1, NULL_BLOCK),
            (0, 2, 5),
            (0, 3, 6),
            (0, 4, 2)
        ]
    );
}

#[test]
fn freed_blocks_inconsistent_with_the_window_are_errors() {
    let err = |ib: &mut InputBatch, s: SchedulerOutput| ib.update(&s).unwrap_err().to_string();
    let window = |w| {
        let mut ib = InputBatch::new(BS, 32, 8).with_sliding_window(w);
        ib.update(&step(vec![new_req(1, vec![1; 9], vec![3, 7, 5], 9)]))
            .unwrap();
        ib.record(&sampled(&[(1, 11)])).unwrap();
        ib
    };
    // Position 9 under window 6 sees 4..=9: two freed blocks would hide position 4..=7.
    let e = err(
        &mut window(Some(6)),
        step(vec![freed(cached(1, 9, 1, true, vec![]), 2)]),
    );
    assert!(e.contains("window of position 9 starts at 4"), "{e}");
    // Full attention frees nothing.
    let e = err(
        &mut window(None),
        step(vec![freed(cached(1, 9, 1, true, vec![]), 1)]),
    );
    assert!(
        e.contains("req-1: 1 freed blocks under full attention"),
        "{e}"
    );
    // More freed blocks than the table holds.
    let e = err(
        &mut window(Some(1)),
        step(vec![freed(cached(1, 9, 1, true, vec![]), 4)]),
    );
    assert!(e.contains("of a table of 3"), "{e}");
    // Freed blocks never come back.
    let mut ib = window(Some(6));
    ib.update(&step(vec![freed(cached(1, 9, 1, true, vec![]), 1)]))
        .unwrap();
    ib.record(&sampled(&[(1, 12)])).unwrap();
    let e = err(&mut ib, step(vec![cached(1, 10, 1, true, vec![])]));
    assert!(e.contains("1 were freed before"), "{e}");
    // Appended entries: NULL_BLOCK only among the freed ones, real blocks only past them.
    let e = err(
        &mut window(Some(1)),
        step(vec![freed(cached(1, 9, 1, true, vec![NULL_BLOCK]), 2)]),
    );
    assert!(e.contains("freed block at column 3"), "{e}");
    let mut ib = InputBatch::new(BS, 32, 8).with_sliding_window(Some(2));
    let mut resumed = freed(new_req(2, vec![1; 9], vec![NULL_BLOCK, 4, 5], 1), 2);
    resumed.num_computed_tokens = 8;
    let e = err(&mut ib, step(vec![resumed]));
    assert!(e.contains("block 4 at column 1"), "{e}");
}

#[test]
fn draft_positions_for_a_request_that_may_not_speculate_are_errors() {
    // Prompt of 3 tokens in block 0, sampled; then a decode with 2 draft positions (block 1).
    let decode_with_drafts = |id: u64| ScheduledRequest {
        num_draft_tokens: 2,
        ..cached(id, 3, 1, true, vec![1])
    };
    let mut plain = InputBatch::new(BS, 8, 4);
    plain
        .update(&step(vec![new_req(1, vec![5, 6, 7], vec![0], 3)]))
        .unwrap();
    plain.record(&sampled(&[(1, 9)])).unwrap();
    plain.apply(&step(vec![decode_with_drafts(1)])).unwrap();
    assert_eq!(plain.propose_requests().len(), 1);

    let mut penalized = InputBatch::new(BS, 8, 4);
    penalized
        .update(&step(vec![new_penalized(2, vec![5, 6, 7], vec![0])]))
        .unwrap();
    penalized.record(&sampled(&[(2, 9)])).unwrap();
    let e = penalized
        .apply(&step(vec![decode_with_drafts(2)]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("may not speculate"), "{e}");
}
