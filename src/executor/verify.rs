//! Sampling on the host from a step's logits: one token per sampling sequence, or, for a
//! sequence that carries drafts, their exact verification (`sampling::rejection`) — the
//! accepted drafts and the target's own token, as consecutive `SampledToken`s, with a
//! `DraftOutcome`. The CPU backend samples everything here (`HostSampler`); the CUDA backend
//! samples every row on the device and verifies point-mass proposals from those draws, bringing
//! only a draft model's sampled (dense) verifications' logit rows here (`DeviceDraws`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::request::RequestId;
use crate::sampling::rejection::{DraftProbs, RejectionSampler, Verify};
use crate::sampling::sampler::{Sampled, Sampler, TokenCounts};
use crate::spec::Proposal;
use crate::step::{
    BatchInput, DraftOutcome, SampleInput, SampledToken, SeqInput, StepOutput, TopLogprobs,
};

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

    /// The proposals of a batch built by hand (tests, benchmarks): its drafts, taken from its
    /// token ids, as point masses.
    pub fn fill_from_batch(&mut self, batch: &BatchInput) {
        self.clear();
        let mut end = 0;
        for s in &batch.seqs {
            end += s.query_len;
            if s.num_drafts > 0 {
                self.ids.push(s.request_id);
                self.proposals.push(Proposal {
                    tokens: batch.token_ids[end - s.num_drafts..end].to_vec(),
                    probs: Vec::new(),
                });
            }
        }
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

/// A step's logits as the host sampler reads them: `[rows, vocab]` row-major, of which only ids
/// below `sample_vocab` (≤ `vocab`) are drawn (the first `sample_vocab` logits of each row).
#[derive(Debug, Clone, Copy)]
pub struct Logits<'a> {
    pub data: &'a [f32],
    pub vocab: usize,
    pub sample_vocab: usize,
}

impl<'a> Logits<'a> {
    /// Rows `first .. first + n`.
    fn rows(&self, first: usize, n: usize) -> Logits<'a> {
        Logits {
            data: &self.data[first * self.vocab..(first + n) * self.vocab],
            ..*self
        }
    }
}

/// One sequence to sample, or whose drafts to verify.
#[derive(Clone, Copy)]
pub struct SeqSample<'a> {
    pub seq: &'a SeqInput,
    pub sample: &'a SampleInput,
    /// Its `1 + drafts.len()` logit rows.
    pub logits: Logits<'a>,
    /// The drafts: the last tokens of the sequence's query.
    pub drafts: &'a [u32],
    /// What the proposer proposed (None: no draft positions, a plain sample).
    pub proposal: Option<&'a Proposal>,
    /// Token counts, for a request with penalties (never one with drafts).
    pub counts: Option<&'a TokenCounts>,
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

    /// Samples every sampling sequence of `batch` from `logits` (`batch.num_logit_rows()`
    /// rows, in seq order), verifying the drafts of those that carry them, into `out`
    /// (`sampled`, and `spec.drafts` for each sequence of `drafts`). `counts(row)` gives the
    /// token counts of the request in input-batch row `row` when it has penalties; requests
    /// that asked for logprobs get their top list in `out.top_logprobs`.
    pub fn sample_batch<'c>(
        &mut self,
        batch: &BatchInput,
        logits: Logits<'_>,
        drafts: &StepDrafts,
        counts: impl Fn(usize) -> Option<&'c TokenCounts>,
        out: &mut StepOutput,
    ) {
        debug_assert_eq!(logits.data.len(), batch.num_logit_rows() * logits.vocab);
        let (mut rows, mut end) = (0, 0);
        let mut cursor = drafts.cursor();
        for seq in &batch.seqs {
            end += seq.query_len;
            let proposal = cursor.next_for(seq);
            let Some(sample) = &seq.sample else { continue };
            let n = seq.num_drafts + 1;
            self.sample_seq(
                SeqSample {
                    seq,
                    sample,
                    logits: logits.rows(rows, n),
                    drafts: &batch.token_ids[end - seq.num_drafts..end],
                    proposal,
                    counts: counts(seq.row),
                },
                out,
            );
            rows += n;
        }
    }

    /// One sequence: a plain sample, or the verification of its drafts.
    pub fn sample_seq(&mut self, x: SeqSample<'_>, out: &mut StepOutput) {
        let (id, s) = (x.seq.request_id, x.sample);
        let Logits {
            data: mut logits,
            vocab,
            sample_vocab,
        } = x.logits;
        debug_assert!(sample_vocab > 0 && sample_vocab <= vocab);
        let mut narrow = std::mem::take(&mut self.narrow);
        if sample_vocab < vocab {
            // Each row cut to its first `sample_vocab` logits (a synthetic model whose
            // tokenizer is smaller than its vocabulary).
            narrow.clear();
            for row in logits.chunks(vocab) {
                narrow.extend_from_slice(&row[..sample_vocab]);
            }
            logits = &narrow;
        }
        let push = |out: &mut StepOutput, x: &Sampled| {
            out.sampled.push(SampledToken {
                request_id: id,
                token: x.token,
                logprob: x.logprob,
            })
        };
        match x.proposal {
            None => {
                let t = self
                    .sampler
                    .sample(logits, &s.params, s.seed, s.output_index, x.counts);
                push(out, &t);
                if let Some(k) = s.params.logprobs {
                    let top = self.sampler.top_logprobs(logits, k);
                    out.top_logprobs.push(TopLogprobs {
                        request_id: id,
                        top,
                    });
                }
            }
            Some(p) => {
                // Verification samples the plain distribution at each position: the scheduler
                // gives drafts only to requests without penalties, bias, min_tokens or logprobs.
                debug_assert!(s.params.may_speculate(), "{id}: drafts it may not have");
                let k = x.drafts.len();
                debug_assert_eq!(x.drafts, &p.tokens[..k]);
                let q = if p.probs.is_empty() {
                    DraftProbs::PointMass
                } else {
                    DraftProbs::Dense(&p.probs[..k * sample_vocab])
                };
                self.verified.clear();
                let accepted = self.rejection.verify(
                    Verify {
                        logits,
                        vocab: sample_vocab,
                        drafts: x.drafts,
                        q,
                        params: &s.params,
                        seed: s.seed,
                        output_index: s.output_index,
                    },
                    &mut self.verified,
                );
                for t in &self.verified {
                    push(out, t);
                }
                out.spec.drafts.push(DraftOutcome {
                    request_id: id,
                    proposed: k,
                    accepted,
                });
            }
        }
        self.narrow = narrow;
    }
}

/// Verification from the target's own draws (the CUDA backend): the device sampled every one
/// of a verifying sequence's `k + 1` rows at its output index, with the request's params and
/// seed — the token decoding without speculation would draw there, given the drafts before it.
/// A point-mass proposal (n-gram lookup, a draft model's greedy drafts) is verified exactly by
/// keeping those draws while each equals its draft (`rejection`'s module docs: the same rule),
/// so only token ids come back from the device. A draft model's sampled drafts (a dense q) need
/// the target's probabilities: their logit rows are read back and verified here.
pub struct DeviceDraws<'a> {
    pub batch: &'a BatchInput,
    /// One per logit row (`batch.num_logit_rows()`), in order: the device's sample there.
    pub rows: &'a [SampledToken],
    pub drafts: &'a StepDrafts,
}

impl DeviceDraws<'_> {
    /// The logit rows (first, count) of the sequences verified on the host, in step order:
    /// those with a dense proposal.
    pub fn dense_rows(&self) -> Vec<(usize, usize)> {
        let mut dense = Vec::new();
        self.walk(|v| {
            if v.proposal.is_some_and(|p| !p.probs.is_empty()) {
                dense.push((v.first, v.drafts.len() + 1));
            }
        });
        dense
    }

    /// The step's output: every sequence's tokens (a plain draw, or the accepted drafts and the
    /// target's own token) and each verification's outcome, into `out`. `dense`: the logit rows
    /// of `dense_rows`, concatenated in its order, verified by `host`.
    pub fn verify(&self, host: &mut HostSampler, dense: Logits<'_>, out: &mut StepOutput) {
        let mut dense_at = 0;
        self.walk(|v| {
            let n = v.drafts.len() + 1;
            let rows = &self.rows[v.first..v.first + n];
            let Some(p) = v.proposal else {
                out.sampled.extend_from_slice(rows);
                return;
            };
            if p.probs.is_empty() {
                let accepted = rows
                    .iter()
                    .zip(v.drafts)
                    .take_while(|(r, &d)| r.token == d)
                    .count();
                out.sampled.extend_from_slice(&rows[..=accepted]);
                out.spec.drafts.push(DraftOutcome {
                    request_id: v.seq.request_id,
                    proposed: v.drafts.len(),
                    accepted,
                });
            } else {
                host.sample_seq(
                    SeqSample {
                        seq: v.seq,
                        sample: v.sample,
                        logits: dense.rows(dense_at, n),
                        drafts: v.drafts,
                        proposal: Some(p),
                        counts: None,
                    },
                    out,
                );
                dense_at += n;
            }
        });
    }

    /// Benchmarks only: the step's output with each verification's outcome drawn by `forced`
    /// instead of compared with the target's draws. A verifying sequence's accepted drafts
    /// come back as its tokens (their K/V, written by this step, stay), then the target's own
    /// draw at the first rejected position, or its bonus draw when all were accepted. Dense
    /// proposals are decided the same way, so their logit rows are not read back.
    pub fn verify_forced(&self, forced: &mut ForcedAcceptance, out: &mut StepOutput) {
        self.walk(|v| {
            let n = v.drafts.len() + 1;
            let rows = &self.rows[v.first..v.first + n];
            if v.proposal.is_none() {
                out.sampled.extend_from_slice(rows);
                return;
            }
            let accepted = forced.accepted(v.drafts.len());
            let id = v.seq.request_id;
            out.sampled.extend(
                v.drafts[..accepted]
                    .iter()
                    .zip(rows)
                    .map(|(&d, r)| SampledToken {
                        request_id: id,
                        token: d,
                        logprob: r.logprob,
                    }),
            );
            out.sampled.push(rows[accepted]);
            out.spec.drafts.push(DraftOutcome {
                request_id: id,
                proposed: v.drafts.len(),
                accepted,
            });
        });
    }

    /// Calls `f` for each sampling sequence, in order.
    fn walk<'s>(&'s self, mut f: impl FnMut(Walked<'s>)) {
        let mut cursor = self.drafts.cursor();
        let (mut first, mut end) = (0, 0);
        for seq in &self.batch.seqs {
            end += seq.query_len;
            let proposal = cursor.next_for(seq);
            let Some(sample) = &seq.sample else { continue };
            f(Walked {
                seq,
                sample,
                first,
                drafts: &self.batch.token_ids[end - seq.num_drafts..end],
                proposal,
            });
            first += seq.num_drafts + 1;
        }
    }
}

/// Benchmarks only (`CudaBackend::force_acceptance`; no config or serving path reaches it):
/// each draft is accepted with probability `rate`, in order, from a seeded generator, up to
/// the first rejection, whatever the target drew there (`DeviceDraws::verify_forced`). Every
/// cost of speculation stays real — the draft passes, the k + 1-row verification, the rollback
/// of rejected K/V, adaptive depth reacting to the acceptance it sees — while the acceptance
/// rate is `rate` by construction: models with random weights accept almost nothing on their
/// own, and bf16 rounding differs between the verify and decode paths, so a recorded
/// continuation does not stay the target's.
#[derive(Debug, Clone)]
pub struct ForcedAcceptance {
    rate: f64,
    rng: ChaCha8Rng,
}

impl ForcedAcceptance {
    pub fn new(rate: f64, seed: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&rate),
            "forced acceptance rate {rate} is not in [0, 1]"
        );
        Ok(ForcedAcceptance {
            rate,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// How many of `k` drafts are accepted: each with probability `rate` until one is not.
    pub fn accepted(&mut self, k: usize) -> usize {
        let (rate, rng) = (self.rate, &mut self.rng);
        (0..k).take_while(|_| rng.random::<f64>() < rate).count()
    }
}

/// A sampling sequence as `DeviceDraws::walk` visits it: its first logit row and its drafts.
struct Walked<'a> {
    seq: &'a SeqInput,
    sample: &'a SampleInput,
    first: usize,
    drafts: &'a [u32],
    proposal: Option<&'a Proposal>,
}

#[cfg(test)]
mod tests;
