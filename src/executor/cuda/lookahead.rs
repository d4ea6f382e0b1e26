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

/// Why the step after a batch is not predicted (`predict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unforeseen {
    /// An empty batch.
    Empty,
    /// A verification: its next step depends on how many drafts it accepts.
    Verification,
    /// A prompt chunk that does not sample: its next step is the next chunk or its first decode.
    NoSample,
    /// A row with penalties (see the module docs).
    Penalties,
    /// A sequence's next position needs a block the scheduler has not allocated yet.
    NeedsBlock,
    /// A sequence reaches `max_tokens` or the context limit with this step.
    LastToken,
}

impl Unforeseen {
    pub const ALL: [Unforeseen; 6] = [
        Unforeseen::Empty,
        Unforeseen::Verification,
        Unforeseen::NoSample,
        Unforeseen::Penalties,
        Unforeseen::NeedsBlock,
        Unforeseen::LastToken,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Unforeseen::Empty => "empty",
            Unforeseen::Verification => "verification",
            Unforeseen::NoSample => "no_sample",
            Unforeseen::Penalties => "penalties",
            Unforeseen::NeedsBlock => "needs_block",
            Unforeseen::LastToken => "last_token",
        }
    }
}

/// Why a step launched ahead was not kept (`keep`): it finishes unused, one GPU step wasted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Miss {
    /// A predicted sequence is not in the plan (finished, aborted or preempted).
    Left,
    /// The plan has a sequence the prediction has not (a request joined), and none left.
    Joined,
    /// The plan is the prediction but changes a block table or a token count.
    TableOrCounts,
    /// The same sequences otherwise laid out or fed: another order, row, position or token.
    Other,
}

impl Miss {
    pub const ALL: [Miss; 4] = [Miss::Left, Miss::Joined, Miss::TableOrCounts, Miss::Other];

    pub fn as_str(self) -> &'static str {
        match self {
            Miss::Left => "left",
            Miss::Joined => "joined",
            Miss::TableOrCounts => "table_or_counts",
            Miss::Other => "other",
        }
    }
}

/// Fills `out` with the step expected to follow `batch`: every sequence decoding one token at
/// its next position with the next output index, in the same order and rows. Returns why not
/// (and leaves `out` unspecified) when that step cannot be foreseen: a sequence that does not
/// sample, one whose table has no block for its next position (the scheduler must allocate
/// one), one that reaches `max_tokens` or `max_context` with this step; or when it must not be
/// run ahead: a sequence with penalties (see the module docs). Input tokens are placeholders
/// (0): the device feeds the sampled ones. `out` has no block tables (the device keeps them).
pub fn predict(
    batch: &BatchInput,
    block_size: usize,
    max_context: usize,
    out: &mut BatchInput,
) -> Result<(), Unforeseen> {
    out.token_ids.clear();
    out.positions.clear();
    out.slot_mapping.clear();
    out.seqs.clear();
    if batch.seqs.is_empty() {
        return Err(Unforeseen::Empty);
    }
    for q in &batch.seqs {
        // A verification's next step depends on how many drafts it accepts (speculative
        // decoding; the CUDA executor refuses it today).
        if q.num_drafts > 0 {
            return Err(Unforeseen::Verification);
        }
        let s = q.sample.as_ref().ok_or(Unforeseen::NoSample)?;
        if s.params.has_penalties() {
            return Err(Unforeseen::Penalties);
        }
        let pos = q.context_len;
        let block = batch.block_table(q).get(pos / block_size).copied();
        let Some(block) = block.filter(|&b| b != NULL_BLOCK) else {
            return Err(Unforeseen::NeedsBlock);
        };
        if s.output_index + 1 >= s.params.max_tokens || pos + 1 > max_context {
            return Err(Unforeseen::LastToken);
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
    Ok(())
}

/// Whether the step launched ahead (`predicted`, fed `fed`) is kept for the plan `actual`: it
/// must be exactly that step (`matches`), and the plan must change no block table and no token
/// count (`changed`: those updates are enqueued behind the step launched ahead). Else why not.
pub fn keep(
    predicted: &BatchInput,
    actual: &BatchInput,
    fed: &[u32],
    changed: bool,
) -> Result<(), Miss> {
    if matches(predicted, actual, fed) {
        return if changed {
            Err(Miss::TableOrCounts)
        } else {
            Ok(())
        };
    }
    let has = |b: &BatchInput, id| b.seqs.iter().any(|q| q.request_id == id);
    if predicted.seqs.iter().any(|p| !has(actual, p.request_id)) {
        Err(Miss::Left)
    } else if actual.seqs.iter().any(|a| !has(predicted, a.request_id)) {
        Err(Miss::Joined)
    } else {
        Err(Miss::Other)
    }
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

/// The host time a kept step hides, µs, that `Gate` weighs by default: the idle gap between
/// steps fell from 21-37 µs (default path) to 10 µs with lookahead at batch 1 on an H100
/// (BENCHMARKS.md, session 31, each variant in its own process).
pub const DEFAULT_GAIN_US: f64 = 20.0;

/// Whether launching ahead pays now (`model.cuda_lookahead = "auto"`). A kept step gains the
/// host gap (`gain`); a missed one costs what is left of a whole step of GPU time when the
/// plan arrives (all of it under load, nothing after an idle spell longer than a step). The
/// gate averages both over about the last `WINDOW` steps that could be predicted, whether or
/// not they were launched (a closed gate still predicts, and checks each prediction against
/// the plan that follows: host work only), and stays open while the gain outweighs the waste:
/// under load, at a 5 ms step and a 20 µs gain, while fewer than one step in 250 misses. So it
/// closes under churn (joins, requests finishing while others run) and opens again when that
/// dies down.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    gain_s: f64,
    /// Moving averages per predicted step: how often it was (or would have been) kept, and
    /// the GPU seconds a launch wasted (or would have).
    kept_rate: f64,
    waste_s: f64,
    step_s: f64,
}

impl Gate {
    /// Predicted steps the kept and waste averages span (their weight 1/WINDOW).
    pub const WINDOW: f64 = 256.0;
    /// Steps the step-time average spans: the batch, hence the step time, changes faster
    /// than the churn.
    pub const STEP_WINDOW: f64 = 16.0;

    /// A gate that weighs `gain_us` µs per kept step; it starts open.
    pub fn new(gain_us: f64) -> Self {
        Gate {
            gain_s: gain_us * 1e-6,
            kept_rate: 1.0,
            waste_s: 0.0,
            step_s: 0.0,
        }
    }

    /// Whether to launch the predicted step.
    pub fn open(&self) -> bool {
        self.waste_s < self.kept_rate * self.gain_s
    }

    /// A prediction met its plan: kept, or (`kept` false) it was or would have been wasted.
    /// `idle_s`: how long after the last step's results went back the plan arrived (the part
    /// of an unused step that ran while the GPU had nothing else to do).
    pub fn record(&mut self, kept: bool, idle_s: f64) {
        let (k, waste) = if kept {
            (1.0, 0.0)
        } else {
            (0.0, (self.step_s - idle_s).max(0.0))
        };
        self.kept_rate += (k - self.kept_rate) / Self::WINDOW;
        self.waste_s += (waste - self.waste_s) / Self::WINDOW;
    }

    /// A step of pure decodes (`is_decode_step`: the kind a prediction is) took `s` seconds,
    /// what an unused one costs.
    pub fn observe_step(&mut self, s: f64) {
        if self.step_s == 0.0 {
            self.step_s = s;
        } else {
            self.step_s += (s - self.step_s) / Self::STEP_WINDOW;
        }
    }
}

/// Whether every sequence of `batch` decodes one known token (no prompt chunk, no drafts):
/// the steps whose time `Gate::observe_step` takes for an unused predicted step's.
pub fn is_decode_step(batch: &BatchInput) -> bool {
    !batch.seqs.is_empty() && batch.num_prefill_tokens() == 0 && batch.num_drafts() == 0
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
    /// Predicted but not launched: the gate was closed (`Gate`).
    pub held: u64,
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
        assert_eq!(predict(ib.batch(), BS, 32, &mut pred), Ok(()));
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
        assert_eq!(predict(ib.batch(), BS, 32, &mut pred), Ok(()));
        let fed = sample(&mut ib, &[50, 51]);
        ib.update(&step(
            vec![decode(1, 6, vec![]), decode(2, 3, vec![])],
            vec![],
        ))
        .unwrap();
        assert!(matches(&pred, ib.batch(), &fed));
        assert_eq!(keep(&pred, ib.batch(), &fed, false), Ok(()));
        assert_eq!(
            keep(&pred, ib.batch(), &fed, true),
            Err(Miss::TableOrCounts),
            "the plan's table or count changes come behind the step launched ahead"
        );
        assert!(!matches(&pred, ib.batch(), &[50, 52]), "another token fed");
        assert_eq!(keep(&pred, ib.batch(), &[50, 52], false), Err(Miss::Other));
    }

    #[test]
    fn any_other_plan_is_a_miss() {
        let plans = [
            // The second finished (the first keeps row 0; one sequence fewer).
            (step(vec![decode(1, 5, vec![])], vec![2]), Miss::Left),
            // A request joins.
            (
                step(
                    vec![
                        decode(1, 5, vec![]),
                        decode(2, 2, vec![]),
                        new_req(3, 3, vec![11], 10),
                    ],
                    vec![],
                ),
                Miss::Joined,
            ),
            // Another order.
            (
                step(vec![decode(2, 2, vec![]), decode(1, 5, vec![])], vec![]),
                Miss::Other,
            ),
            // The first finished: the second takes its row.
            (step(vec![decode(2, 2, vec![])], vec![1]), Miss::Left),
        ];
        for (i, (plan, why)) in plans.iter().enumerate() {
            let (mut ib, pred, fed) = prefilled_and_predicted();
            ib.update(plan).unwrap();
            assert!(!matches(&pred, ib.batch(), &fed), "plan {i} matched");
            assert_eq!(keep(&pred, ib.batch(), &fed, false), Err(*why), "plan {i}");
        }
    }

    #[test]
    fn unforeseeable_steps_are_not_predicted() {
        let mut pred = BatchInput::default();
        // Position 8 needs a third block.
        let mut ib = InputBatch::new(BS, 64, 8);
        ib.update(&step(vec![new_req(1, 8, vec![3, 7], 10)], vec![]))
            .unwrap();
        assert_eq!(
            predict(ib.batch(), BS, 32, &mut pred),
            Err(Unforeseen::NeedsBlock)
        );
        // The last token max_tokens allows.
        let mut ib = InputBatch::new(BS, 64, 8);
        ib.update(&step(vec![new_req(1, 5, vec![3, 7], 1)], vec![]))
            .unwrap();
        assert_eq!(
            predict(ib.batch(), BS, 32, &mut pred),
            Err(Unforeseen::LastToken)
        );
        // The context limit.
        let mut ib = InputBatch::new(BS, 64, 8);
        ib.update(&step(vec![new_req(1, 5, vec![3, 7], 10)], vec![]))
            .unwrap();
        assert_eq!(
            predict(ib.batch(), BS, 5, &mut pred),
            Err(Unforeseen::LastToken)
        );
        assert_eq!(predict(ib.batch(), BS, 6, &mut pred), Ok(()));
        // A chunk that does not sample.
        let mut ib = InputBatch::new(BS, 64, 8);
        let mut chunk = new_req(1, 5, vec![3, 7], 10);
        chunk.num_tokens = 3;
        chunk.sample = false;
        ib.update(&step(vec![chunk], vec![])).unwrap();
        assert_eq!(
            predict(ib.batch(), BS, 32, &mut pred),
            Err(Unforeseen::NoSample)
        );
        assert_eq!(
            predict(&BatchInput::default(), BS, 32, &mut pred),
            Err(Unforeseen::Empty)
        );
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
            assert_eq!(
                predict(ib.batch(), BS, 32, &mut pred),
                Err(Unforeseen::Penalties)
            );
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
        assert_eq!(predict(ib.batch(), BS, 32, &mut pred), Ok(()));
        let s = pred.seqs[0].sample.as_ref().unwrap();
        assert_eq!(*s.params, edited);
        assert_eq!(s.output_index, 1);
    }

    /// The gate weighs the gain of kept steps against the GPU time of unused ones: at a 5 ms
    /// step and a 20 µs gain it pays while fewer than one step in 250 misses under load.
    #[test]
    fn the_gate_closes_under_churn_and_opens_when_it_pays() {
        let step = 5e-3;
        let run = |miss_every: usize, idle_s: f64| {
            let mut g = Gate::new(20.0);
            assert!(g.open(), "a new gate is open");
            let mut open = 0;
            for i in 1..=20_000 {
                g.observe_step(step);
                open += usize::from(g.open());
                g.record(i % miss_every != 0, idle_s);
            }
            open as f64 / 20_000.0
        };
        // Under load (the plan follows at once): one miss in 100 steps wastes 50 µs a step
        // against 19.8 µs gained; one in 1,000 wastes 5 µs.
        let (churn, calm) = (run(100, 0.0), run(1_000, 0.0));
        assert!(churn < 0.05 && calm > 0.9, "{churn} {calm}");
        // A miss after an idle spell longer than a step (the last request finished, the next
        // came later) wasted nothing.
        assert_eq!(run(100, 2.0 * step), 1.0);
        // Half a step idle: half a step wasted.
        let (churn, calm) = (run(100, 0.5 * step), run(500, 0.5 * step));
        assert!(churn < 0.05 && calm > 0.9, "{churn} {calm}");
        // Closed by a burst of misses, it opens again once predictions hold (checked unlaunched).
        let mut g = Gate::new(20.0);
        g.observe_step(step);
        for _ in 0..4 {
            g.record(false, 0.0);
        }
        assert!(!g.open());
        let mut steps = 0;
        while !g.open() {
            g.record(true, 0.0);
            steps += 1;
        }
        assert!((100..2_000).contains(&steps), "{steps}");
    }

    #[test]
    fn fed_tokens_stay_in_the_vocabulary() {
        assert_eq!(fed_token(5, 10), 5);
        assert_eq!(fed_token(10, 10), 0);
        assert_eq!(fed_token(-1, 10), 0);
        assert_eq!(fed_token(i32::MAX, 10), 0);
    }
}
