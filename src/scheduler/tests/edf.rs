//! `merge.edf_documents` (issue 19, session 13): documents take a step's slack by TTFT
//! deadline, medium and long in one queue; those that cannot make it behind the ones kept go
//! last. One knob at a time against the defaults (medium before long, queue order).

use super::adaptive::{adaptive, coarse_cost};
use super::*;

/// 32 tokens a step of which 16 may go to long prompts, trims to any size, `coarse_cost` steps
/// (5 ms + 1 ms a token): a medium prompt of 30 tokens is one 35 ms chunk, a long one of 48
/// three 21 ms chunks.
fn docs_config(edf: bool, medium_ttft_ms: f64, long_ttft_ms: f64) -> SchedulerConfig {
    let mut cfg = SchedulerConfig {
        cost_fallback: coarse_cost(),
        max_num_batched_tokens: 32,
        classes: ClassConfig {
            short_below: 8,
            long_above: 40,
            long_prefill_budget: 16,
        },
        ..adaptive()
    };
    cfg.merge.min_chunk_tokens = 1;
    cfg.merge.edf_documents = edf;
    cfg.slo.medium.ttft_ms = medium_ttft_ms;
    cfg.slo.long.ttft_ms = long_ttft_ms;
    cfg
}

/// Adds `(id, prompt_len, arrival_s)` in this order, runs one step: what it scheduled, in
/// order; then everything runs to completion against the reference.
fn first_step(cfg: SchedulerConfig, docs: &[(u64, usize, f64)]) -> Vec<(u64, usize)> {
    let mut e = Engine::new(cfg, 256);
    for &(id, len, at) in docs {
        e.t = at;
        e.add(request(id).prompt_len(len).max_tokens(2).ignore_eos());
    }
    let (out, _) = e.step();
    e.run_to_completion();
    e.assert_matches_reference();
    scheduled(&out)
}

#[test]
fn documents_take_the_slack_by_ttft_deadline() {
    // A medium (30 tokens, 2 s) and a long document (48 tokens, 1 s) arrive together.
    let docs = [(1, 30, 0.0), (2, 48, 0.0)];
    // Off: the normal lane first, whatever the deadlines: the medium takes 30 of 32 tokens.
    assert_eq!(
        first_step(docs_config(false, 2000.0, 1000.0), &docs),
        vec![(1, 30), (2, 2)]
    );
    // On: the long document's deadline is earlier: its 16 tokens first, then the medium's.
    assert_eq!(
        first_step(docs_config(true, 2000.0, 1000.0), &docs),
        vec![(2, 16), (1, 16)]
    );
}

#[test]
fn a_document_that_cannot_make_its_deadline_behind_earlier_ones_goes_last() {
    // At 10 ms: the long document (deadline 100 ms: 90 left, needs 3 x 21 = 63) goes first;
    // the medium one arrived at 0 (105 ms: 95 left, needs 35 alone, but only 32 behind the
    // long one) is lost; the medium one of 10 ms (115: 105 left, 42 behind) is kept.
    let docs = [(2, 48, 0.0), (1, 30, 0.0), (3, 30, 0.01)];
    assert_eq!(
        first_step(docs_config(true, 105.0, 100.0), &docs),
        vec![(2, 16), (3, 16)]
    );
    // A looser medium SLO (200 ms): both media make it; by deadline, the older one first.
    assert_eq!(
        first_step(docs_config(true, 200.0, 100.0), &docs),
        vec![(2, 16), (1, 16)]
    );
}
