//! The draft-model proposer on the CPU: a small model of the same family runs k autoregressive
//! passes per step over the requests that speculate, batched, on the executor's thread.
//!
//! KV: the draft keeps its own paged pool with as many blocks as the target's, addressed by the
//! target's block tables — one block id holds a span of positions for both models, and its
//! size counts both (`CpuBackend`'s pool is sized for the pair), so draft KV counts in memory
//! pressure and leaves with the request's blocks. Per request the draft remembers how many
//! leading positions it has computed; tokens are only final up to the last known one, so at the
//! next step it resumes from `min(computed, known - 1)` (the first pass catches up: a prompt, a
//! preemption's recompute, a step it sat out, the position after a rejection).
//!
//! Sampled requests draw each draft from the draft's distribution after the request's own
//! params (`rejection::filtered_dense`, the `Draft` role of the seed's stream) and report that
//! distribution for verification; greedy ones take the argmax.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::llama::{KvPool, LlamaModel};
use crate::request::RequestId;
use crate::sampling::rejection::{draw, filtered_dense, sample_dense, Role};
use crate::sampling::sampler::{argmax, Sampler};
use crate::spec::proposer::{Proposal, ProposeRequest, ProposeStats, Proposer};
use crate::step::{BatchInput, SampleInput};

pub struct CpuDraft {
    model: LlamaModel,
    kv: KvPool,
    threads: Option<Arc<rayon::ThreadPool>>,
    /// Leading positions whose draft K/V is computed, per request.
    computed: HashMap<RequestId, usize>,
    sampler: Sampler,
    q: Vec<f32>,
}

impl CpuDraft {
    /// `kv` has the target pool's block count and block size.
    pub fn new(model: LlamaModel, kv: KvPool, threads: Option<Arc<rayon::ThreadPool>>) -> Self {
        CpuDraft {
            model,
            kv,
            threads,
            computed: HashMap::new(),
            sampler: Sampler::new(),
            q: Vec::new(),
        }
    }

    fn forward(&mut self, batch: &BatchInput) -> anyhow::Result<Vec<f32>> {
        batch
            .validate(self.kv.block_size(), self.kv.num_blocks())
            .map_err(|e| anyhow::anyhow!("invalid draft batch: {e}"))?;
        let logits = match &self.threads {
            Some(pool) => pool.install(|| self.model.forward(batch, &mut self.kv))?,
            None => self.model.forward(batch, &mut self.kv)?,
        };
        Ok(logits.flatten_all()?.to_vec1::<f32>()?)
    }
}

impl Proposer for CpuDraft {
    fn propose(
        &mut self,
        reqs: &[ProposeRequest],
        out: &mut Vec<Proposal>,
    ) -> anyhow::Result<ProposeStats> {
        out.clear();
        out.resize_with(reqs.len(), Proposal::default);
        let vocab = self.model.config().vocab_size;
        let bs = self.kv.block_size();
        let depth = reqs.iter().map(|r| r.max_drafts).max().unwrap_or(0);
        let mut stats = ProposeStats::default();
        for pass in 0..depth {
            // Pass 0 catches each request up to its last known token; pass j feeds draft j.
            let mut batch = BatchInput::default();
            let mut active = Vec::with_capacity(reqs.len());
            for (i, r) in reqs.iter().enumerate() {
                if pass >= r.max_drafts {
                    continue;
                }
                let last = r.tokens.len() - 1;
                let (first_pos, query): (usize, &[u32]) = if pass == 0 {
                    let from = self.computed.get(&r.id).copied().unwrap_or(0).min(last);
                    (from, &r.tokens[from..])
                } else {
                    (last + pass, &out[i].tokens[pass - 1..pass])
                };
                self.computed.insert(r.id, first_pos + query.len());
                batch.push_seq(
                    r.id,
                    query,
                    first_pos,
                    r.block_table,
                    bs,
                    Some(SampleInput {
                        params: r.params.clone(),
                        seed: r.seed,
                        output_index: r.output_index + pass,
                    }),
                );
                active.push(i);
            }
            stats.passes += 1;
            stats.tokens += batch.num_tokens();
            let logits = self.forward(&batch)?;
            for (&i, row) in active.iter().zip(logits.chunks(vocab)) {
                let r = &reqs[i];
                let token = if r.params.is_greedy() {
                    argmax(row).0
                } else {
                    filtered_dense(&mut self.sampler, row, r.params, &mut self.q);
                    let u = draw(r.seed, r.output_index + pass, Role::Draft);
                    out[i].probs.extend_from_slice(&self.q);
                    sample_dense(&self.q, u).expect("a filtered distribution keeps a token")
                };
                out[i].tokens.push(token);
            }
        }
        Ok(stats)
    }

    fn forget(&mut self, id: RequestId) {
        self.computed.remove(&id);
    }
}
