//! Sampling on the host from a step's logits: one token per sampling sequence, or, for a
//! sequence that carries drafts, their exact verification (`sampling::rejection`) — the
//! accepted drafts and the target's own token, as consecutive `SampledToken`s, with a
//! `DraftOutcome`. The CPU backend samples everything here; the CUDA backend brings the logits
//! of sampled (non-greedy) verifications here and verifies greedy ones from device argmaxes
//! (`greedy_accepted`).

use crate::request::RequestId;
use crate::sampling::rejection::{DraftProbs, RejectionSampler, Verify};
use crate::sampling::sampler::{Sampled, Sampler, TokenCounts};
use crate::spec::Proposal;
use crate::step::{BatchInput, DraftOutcome, SampledToken, SeqInput, StepOutput, TopLogprobs};

/// The proposals of a step, by request, in step order (the requests that had draft positions;
/// a proposal may hold no token).
#[derive(Debug, Default)]
pub struct StepDrafts {
    pub ids: Vec<RequestId>,
    pub proposals: Vec<Proposal>,
}

impl StepDrafts {
    pub fn clear(&mut self) {
        self.ids.clear();
        self.proposals.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Walks the step's sequences in order, yielding each one's proposal (None for a sequence
    /// without draft positions).
    pub fn cursor(&self) -> DraftCursor<'_> {
        DraftCursor { d: self, at: 0 }
    }
}

pub struct DraftCursor<'a> {
    d: &'a StepDrafts,
    at: usize,
}

impl<'a> DraftCursor<'a> {
    /// The proposal of `seq`, when it had draft positions. Sequences must come in step order.
    pub fn next_for(&mut self, seq: &SeqInput) -> Option<&'a Proposal> {
        match self.d.ids.get(self.at) {
            Some(&id) if id == seq.request_id => {
                self.at += 1;
                Some(&self.d.proposals[self.at - 1])
            }
            _ => None,
        }
    }
}

/// How many drafts a greedy verification accepts, given the target's argmax at each of the
/// k + 1 positions: the drafts up to the first that differs from its position's argmax.
pub fn greedy_accepted(argmax: &[u32], drafts: &[u32]) -> usize {
    drafts
        .iter()
        .zip(argmax)
        .take_while(|(d, a)| d == a)
        .count()
}

/// The host sampler: reusable scratch.
#[derive(Debug, Default)]
pub struct HostSampler {
    sampler: Sampler,
    rejection: RejectionSampler,
    verified: Vec<Sampled>,
    /// Rows cut to the sampled vocabulary.
    narrow: Vec<f32>,
}

impl HostSampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Samples every sampling sequence of `batch` from `logits` (`[batch.num_logit_rows(),
    /// vocab]`, rows in seq order), verifying the drafts of those that carry them, into `out`
    /// (`sampled`, and `spec.drafts` for each sequence of `drafts`). Only ids below
    /// `sample_vocab` (≤ `vocab`) are drawn: the first `sample_vocab` logits of each row.
    /// `counts(row)` gives the token counts of the request in input-batch row `row` when it has
    /// penalties; requests that asked for logprobs get their top list in `out.top_logprobs`.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_batch<'c>(
        &mut self,
        batch: &BatchInput,
        logits: &[f32],
        vocab: usize,
        sample_vocab: usize,
        drafts: &StepDrafts,
        counts: impl Fn(usize) -> Option<&'c TokenCounts>,
        out: &mut StepOutput,
    ) {
        debug_assert_eq!(logits.len(), batch.num_logit_rows() * vocab);
        debug_assert!(sample_vocab > 0 && sample_vocab <= vocab);
        let mut narrow = std::mem::take(&mut self.narrow);
        let (mut rows, mut end) = (0, 0);
        let mut cursor = drafts.cursor();
        for seq in &batch.seqs {
            end += seq.query_len;
            let proposal = cursor.next_for(seq);
            let Some(s) = &seq.sample else { continue };
            let n = seq.num_drafts + 1;
            let mut seq_logits = &logits[rows * vocab..(rows + n) * vocab];
            rows += n;
            if sample_vocab < vocab {
                // Each row cut to its first `sample_vocab` logits (a synthetic model whose
                // tokenizer is smaller than its vocabulary).
                narrow.clear();
                for row in seq_logits.chunks(vocab) {
                    narrow.extend_from_slice(&row[..sample_vocab]);
                }
                seq_logits = &narrow;
            }
            // The drafts are the last tokens of the sequence's query.
            let drafts = &batch.token_ids[end - seq.num_drafts..end];
            let counts = counts(seq.row);
            self.sample_seq(
                seq,
                s,
                seq_logits,
                sample_vocab,
                drafts,
                proposal,
                counts,
                out,
            );
        }
        self.narrow = narrow;
    }

    /// One sequence: a plain sample, or the verification of its drafts.
    #[allow(clippy::too_many_arguments)]
    fn sample_seq(
        &mut self,
        seq: &SeqInput,
        s: &crate::step::SampleInput,
        logits: &[f32],
        vocab: usize,
        drafts: &[u32],
        proposal: Option<&Proposal>,
        counts: Option<&TokenCounts>,
        out: &mut StepOutput,
    ) {
        let id = seq.request_id;
        let push = |out: &mut StepOutput, x: &Sampled| {
            out.sampled.push(SampledToken {
                request_id: id,
                token: x.token,
                logprob: x.logprob,
            })
        };
        let Some(p) = proposal else {
            let x = self
                .sampler
                .sample(logits, &s.params, s.seed, s.output_index, counts);
            push(out, &x);
            if let Some(k) = s.params.logprobs {
                let top = self.sampler.top_logprobs(logits, k);
                out.top_logprobs.push(TopLogprobs {
                    request_id: id,
                    top,
                });
            }
            return;
        };
        // Verification samples the plain distribution at each position: the scheduler gives
        // drafts only to requests without penalties, bias, min_tokens or logprobs.
        debug_assert!(s.params.may_speculate(), "{id}: drafts it may not have");
        let k = drafts.len();
        debug_assert_eq!(drafts, &p.tokens[..k]);
        let q = if p.probs.is_empty() {
            DraftProbs::PointMass
        } else {
            DraftProbs::Dense(&p.probs[..k * vocab])
        };
        self.verified.clear();
        let accepted = self.rejection.verify(
            Verify {
                logits,
                vocab,
                drafts,
                q,
                params: &s.params,
                seed: s.seed,
                output_index: s.output_index,
            },
            &mut self.verified,
        );
        for x in &self.verified {
            push(out, x);
        }
        out.spec.drafts.push(DraftOutcome {
            request_id: id,
            proposed: k,
            accepted,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_acceptance_stops_at_the_first_mismatch() {
        assert_eq!(greedy_accepted(&[5, 6, 7], &[5, 6]), 2);
        assert_eq!(greedy_accepted(&[5, 6, 7], &[5, 9]), 1);
        assert_eq!(greedy_accepted(&[5, 6, 7], &[4, 6]), 0);
        assert_eq!(greedy_accepted(&[5], &[]), 0);
    }
}
