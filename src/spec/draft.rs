//! The draft-model proposer, whatever runs the model (`executor::cpu::draft` on the CPU,
//! `executor::cuda::draft` on the GPU): k autoregressive passes per step over the requests that
//! speculate, batched.
//!
//! KV: the draft keeps its own paged pool with as many blocks as the target's, addressed by the
//! target's block tables — one block id holds a span of positions for both models, and its
//! size counts both (the backend sizes its pool for the pair), so draft KV counts in memory
//! pressure and leaves with the request's blocks. Per request the proposer remembers how many
//! leading positions the draft has computed; tokens are only final up to the last known one, so
//! at the next step it resumes from `min(computed, known - 1)` (the first pass catches up: a
//! prompt, a preemption's recompute, a step it sat out, the position after a rejection). A
//! catch-up longer than one forward takes (`DraftModel::max_tokens`) is split over several.
//!
//! Sampled requests draw each draft from the draft's distribution after the request's own
//! params (`rejection::filtered_dense`, the `Draft` role of the seed's stream) and report that
//! distribution for verification; greedy ones take the argmax.

use foldhash::{HashMap, HashMapExt};

use crate::request::RequestId;
use crate::sampling::rejection::{draw, filtered_dense, sample_dense, Role};
use crate::sampling::sampler::Sampler;
use crate::spec::proposer::{Proposal, ProposeRequest, ProposeStats, Proposer};
use crate::step::{BatchInput, SampleInput};

/// A draft model's forward, on some device.
pub trait DraftModel: Send {
    fn vocab(&self) -> usize;
    fn block_size(&self) -> usize;
    /// Most tokens one forward takes.
    fn max_tokens(&self) -> usize;
    /// Runs `batch` (its K/V written into the draft's pool), into `out`.
    fn forward(&mut self, batch: &BatchInput, out: DraftOut<'_>) -> anyhow::Result<()>;
}

/// Where a draft forward puts its results: for each sampling sequence, in order, the argmax of
/// its logits when its params are greedy (any token otherwise) and, when asked for, its row of
/// logits.
pub struct DraftOut<'a> {
    pub argmax: &'a mut Vec<u32>,
    pub logits: Option<&'a mut Vec<f32>>,
}

pub struct DraftProposer<M> {
    model: M,
    /// Leading positions whose draft K/V is computed, per request.
    computed: HashMap<RequestId, usize>,
    sampler: Sampler,
    q: Vec<f32>,
    argmax: Vec<u32>,
    logits: Vec<f32>,
}

impl<M: DraftModel> DraftProposer<M> {
    pub fn new(model: M) -> Self {
        DraftProposer {
            model,
            computed: HashMap::new(),
            sampler: Sampler::new(),
            q: Vec::new(),
            argmax: Vec::new(),
            logits: Vec::new(),
        }
    }

    /// One pass: each request of `feed` ((request index, first position, query)) computes its
    /// query, in forwards of at most `max_tokens` tokens; each samples its next draft in the
    /// forward that holds its last query token.
    fn pass(
        &mut self,
        reqs: &[ProposeRequest],
        feed: &[(usize, usize, Vec<u32>)],
        pass: usize,
        out: &mut [Proposal],
        stats: &mut ProposeStats,
    ) -> anyhow::Result<()> {
        let (vocab, bs, cap) = (
            self.model.vocab(),
            self.model.block_size(),
            self.model.max_tokens().max(1),
        );
        let any_sampled = feed.iter().any(|f| !reqs[f.0].params.is_greedy());
        let (mut k, mut off) = (0, 0);
        while k < feed.len() {
            let mut batch = BatchInput::default();
            let mut sampling = Vec::new();
            let mut room = cap;
            while k < feed.len() && room > 0 {
                let (i, pos0, query) = (feed[k].0, feed[k].1, &feed[k].2);
                let r = &reqs[i];
                let n = (query.len() - off).min(room);
                let last = off + n == query.len();
                batch.push_seq(
                    r.id,
                    &query[off..off + n],
                    pos0 + off,
                    r.block_table,
                    bs,
                    last.then(|| SampleInput {
                        params: r.params.clone(),
                        seed: r.seed,
                        output_index: r.output_index + pass,
                    }),
                );
                room -= n;
                if last {
                    sampling.push(i);
                    (k, off) = (k + 1, 0);
                } else {
                    off += n;
                }
            }
            stats.passes += 1;
            stats.tokens += batch.num_tokens();
            self.argmax.clear();
            self.logits.clear();
            let out_rows = DraftOut {
                argmax: &mut self.argmax,
                logits: any_sampled.then_some(&mut self.logits),
            };
            self.model.forward(&batch, out_rows)?;
            for (j, &i) in sampling.iter().enumerate() {
                let r = &reqs[i];
                let token = if r.params.is_greedy() {
                    self.argmax[j]
                } else {
                    let row = &self.logits[j * vocab..(j + 1) * vocab];
                    filtered_dense(&mut self.sampler, row, r.params, &mut self.q);
                    let u = draw(r.seed, r.output_index + pass, Role::Draft);
                    out[i].probs.extend_from_slice(&self.q);
                    sample_dense(&self.q, u).expect("a filtered distribution keeps a token")
                };
                out[i].tokens.push(token);
            }
        }
        Ok(())
    }
}

impl<M: DraftModel> Proposer for DraftProposer<M> {
    fn propose(
        &mut self,
        reqs: &[ProposeRequest],
        out: &mut Vec<Proposal>,
    ) -> anyhow::Result<ProposeStats> {
        *out = vec![Proposal::default(); reqs.len()];
        let depth = reqs.iter().map(|r| r.max_drafts).max().unwrap_or(0);
        let mut stats = ProposeStats::default();
        for pass in 0..depth {
            // Pass 0 catches each request up to its last known token; pass j feeds draft j.
            let mut feed = Vec::with_capacity(reqs.len());
            for (i, r) in reqs.iter().enumerate().filter(|(_, r)| pass < r.max_drafts) {
                let last = r.tokens.len() - 1;
                let (first_pos, query) = if pass == 0 {
                    let from = self.computed.get(&r.id).copied().unwrap_or(0).min(last);
                    (from, r.tokens[from..].to_vec())
                } else {
                    (last + pass, vec![out[i].tokens[pass - 1]])
                };
                self.computed.insert(r.id, first_pos + query.len());
                feed.push((i, first_pos, query));
            }
            self.pass(reqs, &feed, pass, out, &mut stats)?;
        }
        Ok(stats)
    }

    fn forget(&mut self, id: RequestId) {
        self.computed.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sampling::params::SamplingParams;

    /// One forward as `Echo` saw it: its tokens, and per sequence (first position, query
    /// length, sampled).
    type Seen = (usize, Vec<(usize, usize, bool)>);

    /// A model that records each forward's batch and answers token = position + 1.
    struct Echo {
        max_tokens: usize,
        seen: Vec<Seen>,
    }

    impl DraftModel for Echo {
        fn vocab(&self) -> usize {
            64
        }
        fn block_size(&self) -> usize {
            4
        }
        fn max_tokens(&self) -> usize {
            self.max_tokens
        }
        fn forward(&mut self, batch: &BatchInput, out: DraftOut<'_>) -> anyhow::Result<()> {
            self.seen.push((
                batch.num_tokens(),
                batch
                    .seqs
                    .iter()
                    .map(|q| (q.context_len - q.query_len, q.query_len, q.sample.is_some()))
                    .collect(),
            ));
            for q in batch.seqs.iter().filter(|q| q.sample.is_some()) {
                out.argmax.push(q.context_len as u32);
            }
            Ok(())
        }
    }

    fn req<'a>(
        id: u64,
        tokens: &'a [u32],
        table: &'a [u32],
        params: &'a Arc<SamplingParams>,
        max_drafts: usize,
    ) -> ProposeRequest<'a> {
        ProposeRequest {
            id: RequestId(id),
            tokens,
            block_table: table,
            max_drafts,
            params,
            seed: 0,
            output_index: 0,
        }
    }

    #[test]
    fn a_long_catch_up_is_split_over_forwards_and_samples_once() {
        let params = Arc::new(SamplingParams::greedy(8));
        let table: Vec<u32> = (0..8).collect();
        let a: Vec<u32> = (0..10).collect();
        let b: Vec<u32> = (0..3).collect();
        let mut p = DraftProposer::new(Echo {
            max_tokens: 8,
            seen: Vec::new(),
        });
        let mut out = Vec::new();
        let reqs = [
            req(1, &a, &table, &params, 2),
            req(2, &b, &table, &params, 2),
        ];
        let stats = p.propose(&reqs, &mut out).unwrap();
        // Pass 0: 10 + 3 tokens in forwards of 8: [a 0..8], [a 8..10, b 0..3]; pass 1: one
        // token each.
        assert_eq!(
            p.model.seen,
            vec![
                (8, vec![(0, 8, false)]),
                (5, vec![(8, 2, true), (0, 3, true)]),
                (2, vec![(10, 1, true), (3, 1, true)]),
            ]
        );
        assert_eq!((stats.passes, stats.tokens), (3, 15));
        // Drafts: the context length after each query (Echo's rule).
        assert_eq!(out[0].tokens, vec![10, 11]);
        assert_eq!(out[1].tokens, vec![3, 4]);
        // The next step resumes from the first position not computed (11: the draft fed at
        // position 10), the known tokens being final up to 12.
        p.model.seen.clear();
        let longer: Vec<u32> = (0..13).collect();
        p.propose(&[req(1, &longer, &table, &params, 1)], &mut out)
            .unwrap();
        assert_eq!(p.model.seen, vec![(2, vec![(11, 2, true)])]);
        // A forgotten request starts over.
        p.forget(RequestId(1));
        p.model.seen.clear();
        p.propose(&[req(1, &longer, &table, &params, 1)], &mut out)
            .unwrap();
        assert_eq!(
            p.model.seen,
            vec![(8, vec![(0, 8, false)]), (5, vec![(8, 5, true)])]
        );
    }
}
