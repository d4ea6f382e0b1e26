//! The simulator's executor: no model, a step takes the time the cost model gives for its
//! shape (with seeded noise), and each sampled sequence gets a token: eos once the request has
//! produced the output length its workload drew, a filler token before. It takes each step the
//! way a real executor does, through a persistent `InputBatch`, so every simulated run also
//! checks the step diffs.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::executor::input_batch::InputBatch;
use crate::scheduler::{prefill_pairs, CostCoefficients, StepFeatures};
use crate::simulate::lookahead::{LookaheadModel, LookaheadReport, LookaheadSetup};
use crate::simulate::workload::standard_normal;
use crate::step::{SampledToken, SchedulerOutput, StepOutput};

pub const EOS: u32 = 2;
/// Filler tokens are ids in FILLER_BASE.. (never eos).
const FILLER_BASE: u32 = 1000;

pub struct CostModelExecutor {
    cost: CostCoefficients,
    noise: f64,
    /// `EngineModel::prefill_attn_min_query`.
    attn_min_query: usize,
    rng: ChaCha8Rng,
    input: InputBatch,
    /// Lookahead decode, when modelled.
    lookahead: Option<LookaheadModel>,
    /// The last step's sampled tokens (what lookahead feeds).
    tokens: Vec<u32>,
}

impl CostModelExecutor {
    /// Over a pool of `num_kv_blocks` blocks of `block_size` tokens, sequences of at most
    /// `max_len` tokens.
    pub fn new(
        cost: CostCoefficients,
        noise: f64,
        attn_min_query: usize,
        seed: u64,
        block_size: usize,
        num_kv_blocks: usize,
        max_len: usize,
    ) -> Self {
        CostModelExecutor {
            cost,
            noise,
            attn_min_query,
            rng: ChaCha8Rng::seed_from_u64(seed),
            input: InputBatch::new(block_size, num_kv_blocks, max_len.div_ceil(block_size))
                .track_table_changes(),
            lookahead: None,
            tokens: Vec::new(),
        }
    }

    /// Models lookahead decode (`simulate::lookahead`).
    pub fn with_lookahead(
        mut self,
        setup: LookaheadSetup,
        block_size: usize,
        max_len: usize,
    ) -> Self {
        self.lookahead = Some(LookaheadModel::new(setup, block_size, max_len));
        self
    }

    /// What lookahead did, when modelled.
    pub fn lookahead_report(self) -> Option<LookaheadReport> {
        self.lookahead.map(LookaheadModel::finish)
    }

    /// Seconds the step takes.
    pub fn step_time(&mut self, step: &SchedulerOutput) -> f64 {
        let mut f = StepFeatures::from_step(step);
        for s in step.scheduled.iter().filter(|s| s.num_tokens > 1) {
            let ctx = s.num_computed_tokens + s.num_tokens;
            let q = s.num_tokens.max(self.attn_min_query.min(ctx));
            f.prefill_attn_pairs += prefill_pairs(q, ctx) - prefill_pairs(s.num_tokens, ctx);
        }
        let ms = self.cost.predict_ms(&f);
        let jitter = (1.0 + self.noise * standard_normal(&mut self.rng)).max(0.5);
        ms * jitter / 1e3
    }

    /// The step's sampled tokens, and the simulated seconds it took; `output_len(id)` is the
    /// request's drawn output length. The step starts at `now_s` and takes `step_s`
    /// (`step_time`), or more or less under lookahead.
    pub fn execute(
        &mut self,
        step: &SchedulerOutput,
        now_s: f64,
        step_s: f64,
        output_len: impl Fn(u64) -> usize,
    ) -> anyhow::Result<(StepOutput, f64)> {
        self.input.update(step)?;
        let mut changed = false;
        self.input.drain_table_changes(|_, _, _| changed = true);
        let batch = self.input.batch();
        let mut elapsed_s = step_s;
        if let Some(la) = &mut self.lookahead {
            elapsed_s += la.on_plan(batch, changed, now_s);
        }
        let sampled: Vec<SampledToken> = batch
            .seqs
            .iter()
            .filter_map(|s| {
                let sample = s.sample.as_ref()?;
                let id = s.request_id;
                let token = if sample.output_index + 1 >= output_len(id.0) {
                    EOS
                } else {
                    FILLER_BASE
                        + ((id.0 as u32).wrapping_mul(7919) ^ sample.output_index as u32) % 30_000
                };
                Some(SampledToken {
                    request_id: id,
                    token,
                    logprob: 0.0,
                })
            })
            .collect();
        if let Some(la) = &mut self.lookahead {
            self.tokens.clear();
            self.tokens.extend(sampled.iter().map(|s| s.token));
            la.on_launch(
                batch,
                &self.tokens,
                elapsed_s,
                now_s + elapsed_s,
                &self.cost,
            );
        }
        let out = StepOutput {
            sampled,
            elapsed: std::time::Duration::from_secs_f64(elapsed_s),
            ..StepOutput::default()
        };
        self.input.record(&out)?;
        Ok((out, elapsed_s))
    }
}
