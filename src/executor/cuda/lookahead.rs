//! Lookahead decode, the host side (pure, tested on the CPU): which step to launch before the
//! scheduler has asked for it, and whether the step it then asks for is that one.
//!
//! The step contract (`Backend::execute`) returns a step's sampled tokens, and the scheduler needs
//! them (`update_from_output`) before it plans the next step, so the next plan cannot reach the
//! executor before this step's tokens have reached the host. What the executor can do within the
//! contract is guess: when every sequence of step n samples, the plan of step n+1 is most often
//! "each of them decodes the token it just sampled". The backend launches that predicted step
//! right behind step n (its input tokens copied on the device from step n's samples), then waits
//! for step n and returns; the host's round trip (scheduler, output processor, the next
//! `execute`) overlaps step n+1 on the GPU. If the plan that arrives is exactly the prediction
//! the launched step is kept; otherwise it finishes unused and the plan runs after it.
//!
//! Why an unused predicted step is harmless: it writes K/V only at each sequence's next
//! position, inside a block the sequence already holds (a prediction never needs a new block),
//! and that block is not full of computed tokens, so it has no prefix-cache hash and no other
//! request can read it as a cached prefix; if the block is freed and handed to another request,
//! that request's writes come later on the same stream. The values it writes are the ones the
//! real step writes for the same token. Its samples are overwritten by the next launch. What it
//! costs is one step of GPU time whenever the prediction misses (a request that finishes or is
//! preempted, one that joins, a new block, a block freed behind a sliding window).
//!
//! Not predicted: a step with a row that has penalties. The sampler bumps that row's device
//! token counts with each token it samples, so an unused predicted step would leave a count of
//! a token never emitted (and the count changes of the next plan are enqueued behind the step
//! launched ahead, which therefore is never kept when there are any). Logit edits (bias,
//! min_tokens mask: `step_meta` packs them from the predicted output index) and top
//! log-probabilities (read from the kept step's own outputs) are predicted like the rest.

use crate::step::{BatchInput, SampleInput, SeqInput, NULL_BLOCK};

/// Fills `out` with the step expected to follow `batch`: every sequence decoding one token at
/// its next position with the next output index, in the same order and rows. Returns false (and
/// leaves `out` unspecified) when that step cannot be foreseen: a sequence that does not sample,
/// one whose table has no block for its next position (the scheduler must allocate one), one
/// that reaches `max_tokens` or `max_context` with this step; or when it must not be run ahead:
/// a sequence with penalties (see the module docs). Input tokens are placeholders (0):
/// the device feeds the sampled ones. `out` has no block tables (the device keeps them).
pub fn predict(
    batch: &BatchInput,
    block_size: usize,
    max_context: usize,
    out: &mut BatchInput,
) -> bool {
    out.token_ids.clear();
    out.positions.clear();
    out.slot_mapping.clear();
    out.seqs.clear();
    if batch.seqs.is_empty() {
        return false;
    }
    for q in &batch.seqs {
        // A verification's next step depends on how many drafts it accepts (speculative
        // decoding; the CUDA executor refuses it today).
        if q.num_drafts > 0 {
            return false;
        }
        let Some(s) = q.sample.as_ref().filter(|s| !s.params.has_penalties()) else {
            return false;
        };
        let pos = q.context_len;
        let block = batch.block_table(q).get(pos / block_size).copied();
        let Some(block) = block.filter(|&b| b != NULL_BLOCK) else {
            return false;
        };
        if s.output_index + 1 >= s.params.max_tokens || pos + 1 > max_context {
            return false;
        }
        out.token_ids.push(0);
        out.positions.push(pos as u32);
        out.slot_mapping
            .push(block * block_size as u32 + (pos % block_size) as u32);
        out.seqs.push(SeqInput {
            request_id: q.request_id,
            row: q.row,
            query_len: 1,
            context_len: pos + 1,
            sample: Some(SampleInput {
                params: s.params.clone(),
                seed: s.seed,
                output_index: s.output_index + 1,
            }),
            num_drafts: 0,
        });
    }
    true
}

/// Whether `actual` (the step the scheduler asked for, as the persistent batch built it) is
/// exactly `predicted`, whose input tokens were `fed` (what `feed_tokens` wrote: the previous
/// step's samples, 0 for one outside the vocabulary).
pub fn matches(predicted: &BatchInput, actual: &BatchInput, fed: &[u32]) -> bool {
    predicted.seqs.len() == actual.seqs.len()
        && actual.token_ids.len() == predicted.seqs.len()
        && fed.len() >= actual.token_ids.len()
        && actual.token_ids[..] == fed[..actual.token_ids.len()]
        && predicted.positions == actual.positions
        && predicted.slot_mapping == actual.slot_mapping
        && predicted.seqs.iter().zip(&actual.seqs).all(|(p, a)| {
            p.request_id == a.request_id
                && p.row == a.row
                && p.query_len == a.query_len
                && p.context_len == a.context_len
                && p.num_drafts == a.num_drafts
                && match (&p.sample, &a.sample) {
                    (Some(x), Some(y)) => {
                        x.seed == y.seed && x.output_index == y.output_index && x.params == y.params
                    }
                    _ => false,
                }
        })
}

/// What the device fed for each raw sampled token (`feed_tokens.cu`): itself inside the
/// vocabulary, else 0.
pub fn fed_token(raw: i32, vocab: usize) -> u32 {
    if raw >= 0 && (raw as usize) < vocab {
        raw as u32
    } else {
        0
    }
}

/// Counts of what lookahead did, for benchmarks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LookaheadStats {
    /// Predicted steps launched.
    pub launched: u64,
    /// Kept: the plan was the prediction.
    pub hits: u64,
    /// Finished unused (a GPU step wasted).
    pub misses: u64,
    /// Steps after which nothing could be predicted.
    pub unpredictable: u64,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::executor::input_batch::InputBatch;
    use crate::request::RequestId;
    use crate::sampling::params::SamplingParams;
    use crate::step::{SampledToken, ScheduledRequest, SchedulerOutput, StepOutput};

    const BS: usize = 4;

    fn new_req(id: u64, prompt: usize, blocks: Vec<u32>, max_tokens: usize) -> ScheduledRequest {
        with_params(id, prompt, blocks, SamplingParams::greedy(max_tokens))
    }

    fn with_params(
        id: u64,
        prompt: usize,
        blocks: Vec<u32>,
        params: SamplingParams,
    ) -> ScheduledRequest {
        let tokens = (0..prompt as u32).map(|t| t + 10 * id as u32).collect();
        ScheduledRequest::first(id, tokens, prompt, blocks, Arc::new(params), id)
    }

    fn decode(id: u64, computed: usize, blocks: Vec<u32>) -> ScheduledRequest {
        ScheduledRequest::running(id, computed, 1, true, blocks)
    }

    fn step(reqs: Vec<ScheduledRequest>, finished: Vec<u64>) -> SchedulerOutput {
        SchedulerOutput {
            scheduled: reqs,
            finished_req_ids: finished.into_iter().map(RequestId).collect(),
            ..SchedulerOutput::default()
        }
    }

    /// Records `tokens` as the samples of the last step, in seq order; returns what was fed.
    fn sample(ib: &mut InputBatch, tokens: &[u32]) -> Vec<u32> {
        let sampled = ib
            .batch()
            .seqs
            .iter()
            .zip(tokens)
            .map(|(q, &token)| SampledToken {
                request_id: q.request_id,
                token,
                logprob: 0.0,
            })
            .collect();
        ib.record(&StepOutput {
            sampled,
            elapsed: Default::default(),
            ..StepOutput::default()
        })
        .unwrap();
        tokens.to_vec()
    }

    /// Two requests prefilled (prompts of 5 and 2 tokens), the decode step after them predicted,
    /// then tokens 40 and 41 sampled: (batch, prediction, tokens fed).
    fn prefilled_and_predicted() -> (InputBatch, BatchInput, Vec<u32>) {
        let mut ib = InputBatch::new(BS, 64, 8);
        ib.update(&step(
            vec![new_req(1, 5, vec![3, 7], 10), new_req(2, 2, vec![9], 10)],
            vec![],
        ))
        .unwrap();
        let mut pred = BatchInput::default();
        assert!(predict(ib.batch(), BS, 32, &mut pred));
        let fed = sample(&mut ib, &[40, 41]);
        (ib, pred, fed)
    }

    /// The prediction after prefills and after a decode is the step the scheduler sends next.
    #[test]
    fn predicts_the_next_decode_of_every_sequence() {
        let (mut ib, mut pred, fed) = prefilled_and_predicted();
        assert_eq!(pred.positions, vec![5, 2]);
        // Position 5 is offset 1 of block 7; position 2 is offset 2 of block 9.
        assert_eq!(pred.slot_mapping, vec![7 * 4 + 1, 9 * 4 + 2]);
        assert_eq!(pred.seqs[0].sample.as_ref().unwrap().output_index, 1);
        ib.update(&step(
            vec![decode(1, 5, vec![]), decode(2, 2, vec![])],
            vec![],
        ))
        .unwrap();
        assert!(matches(&pred, ib.batch(), &fed));
        // The same steps again from there.
        assert!(predict(ib.batch(), BS, 32, &mut pred));
        let fed = sample(&mut ib, &[50, 51]);
        ib.update(&step(
            vec![decode(1, 6, vec![]), decode(2, 3, vec![])],
            vec![],
        ))
        .unwrap();
        assert!(matches(&pred, ib.batch(), &fed));
        assert!(!matches(&pred, ib.batch(), &[50, 52]), "another token fed");
    }

    #[test]
    fn any_other_plan_is_a_miss() {
        let plans = [
            // The second finished (the first keeps row 0; one sequence fewer).
            step(vec![decode(1, 5, vec![])], vec![2]),
            // A request joins.
            step(
                vec![
                    decode(1, 5, vec![]),
                    decode(2, 2, vec![]),
                    new_req(3, 3, vec![11], 10),
                ],
                vec![],
            ),
            // Another order.
            step(vec![decode(2, 2, vec![]), decode(1, 5, vec![])], vec![]),
            // The first finished: the second takes its row.
            step(vec![decode(2, 2, vec![])], vec![1]),
        ];
        for (i, plan) in plans.iter().enumerate() {
            let (mut ib, pred, fed) = prefilled_and_predicted();
            ib.update(plan).unwrap();
            assert!(!matches(&pred, ib.batch(), &fed), "plan {i} matched");
        }
    }

    #[test]
    fn unforeseeable_steps_are_not_predicted() {
        let mut pred = BatchInput::default();
        // Position 8 needs a third block.
        let mut ib = InputBatch::new(BS, 64, 8);
        ib.update(&step(vec![new_req(1, 8, vec![3, 7], 10)], vec![]))
            .unwrap();
        assert!(!predict(ib.batch(), BS, 32, &mut pred));
        // The last token max_tokens allows.
        let mut ib = InputBatch::new(BS, 64, 8);
        ib.update(&step(vec![new_req(1, 5, vec![3, 7], 1)], vec![]))
            .unwrap();
        assert!(!predict(ib.batch(), BS, 32, &mut pred));
        // The context limit.
        let mut ib = InputBatch::new(BS, 64, 8);
        ib.update(&step(vec![new_req(1, 5, vec![3, 7], 10)], vec![]))
            .unwrap();
        assert!(!predict(ib.batch(), BS, 5, &mut pred));
        assert!(predict(ib.batch(), BS, 6, &mut pred));
        // A chunk that does not sample.
        let mut ib = InputBatch::new(BS, 64, 8);
        let mut chunk = new_req(1, 5, vec![3, 7], 10);
        chunk.num_tokens = 3;
        chunk.sample = false;
        ib.update(&step(vec![chunk], vec![])).unwrap();
        assert!(!predict(ib.batch(), BS, 32, &mut pred));
        assert!(!predict(&BatchInput::default(), BS, 32, &mut pred));
    }

    /// Penalties: never run ahead (the sampler counts on the device what it samples). Logit
    /// bias, the min_tokens mask and top log-probabilities: predicted, the output index moved on.
    #[test]
    fn rows_with_penalties_are_not_predicted() {
        let mut pred = BatchInput::default();
        for (presence, frequency, repetition) in
            [(0.5, 0.0, 1.0), (0.0, -0.2, 1.0), (0.0, 0.0, 1.1)]
        {
            let pen = SamplingParams {
                presence_penalty: presence,
                frequency_penalty: frequency,
                repetition_penalty: repetition,
                ..SamplingParams::greedy(10)
            };
            let mut ib = InputBatch::new(BS, 64, 8);
            ib.update(&step(
                vec![
                    new_req(1, 5, vec![3, 7], 10),
                    with_params(2, 2, vec![9], pen),
                ],
                vec![],
            ))
            .unwrap();
            assert!(!predict(ib.batch(), BS, 32, &mut pred));
        }
        let edited = SamplingParams {
            logit_bias: vec![(3, 1.0)],
            min_tokens: 4,
            min_tokens_blocked: vec![2],
            logprobs: Some(5),
            ..SamplingParams::greedy(10)
        };
        let mut ib = InputBatch::new(BS, 64, 8);
        ib.update(&step(
            vec![with_params(1, 5, vec![3, 7], edited.clone())],
            vec![],
        ))
        .unwrap();
        assert!(predict(ib.batch(), BS, 32, &mut pred));
        let s = pred.seqs[0].sample.as_ref().unwrap();
        assert_eq!(*s.params, edited);
        assert_eq!(s.output_index, 1);
    }

    #[test]
    fn fed_tokens_stay_in_the_vocabulary() {
        assert_eq!(fed_token(5, 10), 5);
        assert_eq!(fed_token(10, 10), 0);
        assert_eq!(fed_token(-1, 10), 0);
        assert_eq!(fed_token(i32::MAX, 10), 0);
    }
}
