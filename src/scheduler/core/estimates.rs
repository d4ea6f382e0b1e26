//! Estimates the policies share: step times from the cost model, output lengths from the
//! requests seen so far.

use super::{Scheduler, MIN_OUTPUT_SAMPLES};
use crate::kv::KvCacheManager;
use crate::request::RequestId;
use crate::scheduler::cost_model::{CostCoefficients, StepFeatures};
use crate::scheduler::request::Request;

impl Scheduler {
    /// Output length a request is expected to reach: the observed mean once enough requests
    /// finished, the configured guess before.
    pub(super) fn expected_output(&self) -> f64 {
        if self.num_output_samples >= MIN_OUTPUT_SAMPLES {
            self.mean_output
        } else {
            self.cfg.merge.expected_output_tokens as f64
        }
    }

    /// Linear part of prefilling `tokens` in steps of at most `per_step` tokens.
    pub(super) fn prefill_ms(&self, tokens: usize, per_step: usize) -> f64 {
        prefill_ms_with(&self.cost.coefficients(), tokens, per_step)
    }

    /// Step-time coefficients for a lower bound: per coefficient, the cheaper of the online fit
    /// and the configured prior. Early in a run the fit has seen only short prompts and decodes,
    /// which cannot tell the per-step base from the per-token cost; it can then put several
    /// times the true per-token cost on a document's prefill, and a bound built on that alone
    /// would refuse documents that would have met their SLO (issue 19, the H200 runs).
    pub(super) fn optimistic_coefficients(&self) -> CostCoefficients {
        let (f, p) = (self.cost.coefficients(), self.cfg.cost_fallback);
        CostCoefficients {
            base_ms: f.base_ms.min(p.base_ms),
            per_prefill_token_ms: f.per_prefill_token_ms.min(p.per_prefill_token_ms),
            per_decode_seq_ms: f.per_decode_seq_ms.min(p.per_decode_seq_ms),
            per_kv_token_ms: f.per_kv_token_ms.min(p.per_kv_token_ms),
            per_prefill_attn_pair_ms: f.per_prefill_attn_pair_ms.min(p.per_prefill_attn_pair_ms),
            per_prefill_floor_pair_ms: f.per_prefill_floor_pair_ms.min(p.per_prefill_floor_pair_ms),
        }
    }

    /// Predicted time of a step that decodes every running request once.
    pub(super) fn decode_step_ms(&self) -> f64 {
        let mut step = StepFeatures::default();
        for id in &self.running {
            step.add_seq(1, self.requests[id].num_computed + 1);
        }
        self.cost.predict_ms(&step)
    }

    /// Output tokens a request is still expected to generate.
    pub(super) fn expected_remaining_output(&self, req: &Request) -> usize {
        let left = req
            .params
            .max_tokens
            .saturating_sub(req.num_output_tokens());
        let expected =
            (self.expected_output().ceil() as usize).saturating_sub(req.num_output_tokens());
        left.min(expected)
    }

    /// Blocks a running request will still take: the rest of its prompt and its expected output.
    pub(super) fn expected_growth_blocks(&self, id: RequestId, kv: &KvCacheManager) -> usize {
        let req = &self.requests[&id];
        let total = req.num_tokens() + self.expected_remaining_output(req);
        total
            .div_ceil(kv.block_size())
            .saturating_sub(kv.block_table(id).len())
    }
}

/// Linear part of prefilling `tokens` in steps of at most `per_step` tokens under `c`.
pub(super) fn prefill_ms_with(c: &CostCoefficients, tokens: usize, per_step: usize) -> f64 {
    tokens.div_ceil(per_step.max(1)) as f64 * c.base_ms + tokens as f64 * c.per_prefill_token_ms
}
