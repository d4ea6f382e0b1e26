//! Step-time model: predicted executor time of a batch from its shape, fitted online.
//!
//! `t = base + a·prefill_tokens + b·decode_seqs + c·kv_tokens_read + d·prefill_attn_pairs +
//! e·prefill_floor_pairs` (ms). The first four are the features of a step's shape
//! (`StepFeatures::from_step`); `prefill_attn_pairs` is the quadratic part of a prefill chunk's
//! attention (each query token reads its whole context), which dominates the chunks of a long
//! document and is not visible in the other three.
//!
//! `prefill_floor_pairs` is the prefill attention kernel's wave floor: a chunk of fewer than
//! [`ATTN_FLOOR_QUERIES`] queries at a longer context costs on the H200 about what that many
//! queries cost (the flash prefill kernel has one CTA per 64 queries and head and no split over
//! the keys, so a short chunk leaves most SMs idle while each CTA walks the whole context). The
//! feature is the pairs the padding adds; its coefficient is fitted like the others, so a kernel
//! without the floor (split-KV) fits it toward 0 (issue 19; `scripts/step_times.py` measured it:
//! call e's 25,982 steps fit with RMSE 2.9 ms against 4.3 ms for the linear model). A prior of 0
//! means "no floor": the coefficient is then held at 0, not fitted.
//!
//! Fitting is ridge least squares with exponential forgetting (so the model follows a backend
//! whose speed drifts), pulled toward the configured fallback coefficients in proportion to how
//! little each feature has been excited, and constrained to non-negative coefficients (a negative
//! cost per token would let the scheduler plan arbitrarily large steps).

use serde::{Deserialize, Serialize};

use crate::step::SchedulerOutput;

const N: usize = 6;

/// Queries below which a prefill chunk costs as many as this (the wave floor, see above). 512:
/// the floor that fits call e's steps best (RMSE 2.88 ms; 256: 3.59, 1024: 2.86).
pub const ATTN_FLOOR_QUERIES: usize = 512;

/// Coefficients of the step-time model, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostCoefficients {
    /// Fixed cost of a step (weights read once, launch overheads).
    pub base_ms: f64,
    pub per_prefill_token_ms: f64,
    pub per_decode_seq_ms: f64,
    /// Per K/V token attention reads (sum of context lengths).
    pub per_kv_token_ms: f64,
    /// Per (prefill query token × context token) pair.
    pub per_prefill_attn_pair_ms: f64,
    /// Per pair the wave floor adds to a short chunk at long context (`prefill_floor_pairs`);
    /// 0: the backend has no floor, and the fit leaves it at 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub per_prefill_floor_pair_ms: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl Default for CostCoefficients {
    /// A 7B model (Llama-2-7B shapes, bf16) on one H200; see `configs/workloads/README.md` for
    /// the derivation. Only a prior: the online fit replaces it.
    fn default() -> Self {
        CostCoefficients {
            base_ms: 3.6,
            per_prefill_token_ms: 0.035,
            per_decode_seq_ms: 0.015,
            per_kv_token_ms: 1.3e-4,
            per_prefill_attn_pair_ms: 1.3e-6,
            per_prefill_floor_pair_ms: 0.0,
        }
    }
}

impl CostCoefficients {
    fn to_array(self) -> [f64; N] {
        [
            self.base_ms,
            self.per_prefill_token_ms,
            self.per_decode_seq_ms,
            self.per_kv_token_ms,
            self.per_prefill_attn_pair_ms,
            self.per_prefill_floor_pair_ms,
        ]
    }

    fn from_array(a: [f64; N]) -> Self {
        CostCoefficients {
            base_ms: a[0],
            per_prefill_token_ms: a[1],
            per_decode_seq_ms: a[2],
            per_kv_token_ms: a[3],
            per_prefill_attn_pair_ms: a[4],
            per_prefill_floor_pair_ms: a[5],
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.to_array().iter().all(|c| c.is_finite() && *c >= 0.0) {
            Ok(())
        } else {
            Err("cost coefficients must be finite and >= 0".into())
        }
    }

    pub fn predict_ms(&self, f: &StepFeatures) -> f64 {
        dot(&self.to_array(), &f.to_array())
    }
}

/// The shape of a (planned or executed) step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepFeatures {
    pub prefill_tokens: f64,
    pub decode_seqs: f64,
    pub kv_tokens_read: f64,
    pub prefill_attn_pairs: f64,
    /// Pairs the wave floor adds (`ATTN_FLOOR_QUERIES`).
    pub prefill_floor_pairs: f64,
}

impl StepFeatures {
    pub fn from_step(step: &SchedulerOutput) -> Self {
        let mut f = StepFeatures::default();
        for s in &step.scheduled {
            f.add_seq(s.num_tokens, s.num_computed_tokens + s.num_tokens);
        }
        f
    }

    /// Adds one sequence computing `query_len` tokens that end at `context_len`. A 1-token query
    /// counts as a decode, as in `step::BatchInput::num_decode_seqs`.
    pub fn add_seq(&mut self, query_len: usize, context_len: usize) {
        self.kv_tokens_read += context_len as f64;
        if query_len == 1 {
            self.decode_seqs += 1.0;
        } else {
            self.prefill_tokens += query_len as f64;
            self.prefill_attn_pairs += prefill_pairs(query_len, context_len);
            self.prefill_floor_pairs += floor_pairs(query_len, context_len);
        }
    }

    fn to_array(self) -> [f64; N] {
        [
            1.0,
            self.prefill_tokens,
            self.decode_seqs,
            self.kv_tokens_read,
            self.prefill_attn_pairs,
            self.prefill_floor_pairs,
        ]
    }
}

/// Attention pairs of a prefill chunk of `q` queries ending at position `ctx`.
pub fn prefill_pairs(q: usize, ctx: usize) -> f64 {
    q as f64 * (ctx as f64 - q as f64 / 2.0)
}

/// Pairs the wave floor adds to a chunk of `q` queries ending at `ctx`: it costs as
/// `min(ATTN_FLOOR_QUERIES, ctx)` queries would. 0 for a whole prompt in one chunk (`q == ctx`).
pub fn floor_pairs(q: usize, ctx: usize) -> f64 {
    let padded = q.max(ATTN_FLOOR_QUERIES.min(ctx));
    prefill_pairs(padded, ctx) - prefill_pairs(q, ctx)
}

fn dot(a: &[f64; N], b: &[f64; N]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Online ridge least squares over [`StepFeatures`].
#[derive(Debug, Clone)]
pub struct CostModel {
    prior: [f64; N],
    coef: [f64; N],
    xtx: [[f64; N]; N],
    xty: [f64; N],
    samples: u64,
    min_samples: u64,
    /// Weight of the previous sums at each new sample.
    forgetting: f64,
    /// Pull toward the prior, relative to each feature's own excitation.
    ridge: f64,
}

impl CostModel {
    pub fn new(fallback: CostCoefficients) -> Self {
        Self::with_min_samples(fallback, 32)
    }

    /// As `new`, switching from the fallback to the fit after `min_samples` steps.
    pub fn with_min_samples(fallback: CostCoefficients, min_samples: u64) -> Self {
        let prior = fallback.to_array();
        CostModel {
            prior,
            coef: prior,
            xtx: [[0.0; N]; N],
            xty: [0.0; N],
            samples: 0,
            min_samples,
            forgetting: 0.998,
            ridge: 1e-6,
        }
    }

    /// Steps observed so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Whether the fit (rather than the fallback) is in use.
    pub fn is_fitted(&self) -> bool {
        self.samples >= self.min_samples
    }

    pub fn coefficients(&self) -> CostCoefficients {
        CostCoefficients::from_array(self.coef)
    }

    pub fn predict_ms(&self, f: &StepFeatures) -> f64 {
        dot(&self.coef, &f.to_array())
    }

    /// Folds in one measured step.
    pub fn observe(&mut self, f: &StepFeatures, elapsed_ms: f64) {
        if !elapsed_ms.is_finite() || elapsed_ms <= 0.0 {
            return;
        }
        let x = f.to_array();
        for i in 0..N {
            for j in 0..N {
                self.xtx[i][j] = self.forgetting * self.xtx[i][j] + x[i] * x[j];
            }
            self.xty[i] = self.forgetting * self.xty[i] + x[i] * elapsed_ms;
        }
        self.samples += 1;
        if self.is_fitted() {
            if let Some(c) = self.solve() {
                self.coef = c;
            }
        }
    }

    /// Non-negative ridge solution by active set: solve, pin negative coefficients at 0, repeat.
    fn solve(&self) -> Option<[f64; N]> {
        // A coefficient whose prior is 0 on the floor feature means the backend has none: held.
        let mut free: [bool; N] = std::array::from_fn(|i| i != N - 1 || self.prior[i] > 0.0);
        for _ in 0..N {
            let mut a = [[0.0; N]; N];
            let mut b = [0.0; N];
            for i in 0..N {
                if !free[i] {
                    a[i][i] = 1.0;
                    continue;
                }
                // Ridge scaled by the feature's own energy, plus a floor: an unexcited feature
                // (a zero column) keeps its prior exactly.
                let w = self.ridge * self.xtx[i][i] + 1e-12;
                for j in 0..N {
                    if free[j] {
                        a[i][j] = self.xtx[i][j];
                    }
                }
                a[i][i] += w;
                b[i] = self.xty[i] + w * self.prior[i];
            }
            // Jacobi scaling: the features differ by ~10 orders of magnitude.
            let d: [f64; N] = std::array::from_fn(|i| a[i][i].sqrt());
            for i in 0..N {
                for j in 0..N {
                    a[i][j] /= d[i] * d[j];
                }
                b[i] /= d[i];
            }
            let mut c = gauss_solve(a, b)?;
            for i in 0..N {
                c[i] /= d[i];
            }
            match (0..N).find(|&i| free[i] && c[i] < 0.0) {
                Some(i) => free[i] = false,
                None => return c.iter().all(|v| v.is_finite()).then_some(c),
            }
        }
        None
    }
}

/// Gaussian elimination with partial pivoting; None when singular.
fn gauss_solve(mut a: [[f64; N]; N], mut b: [f64; N]) -> Option<[f64; N]> {
    for col in 0..N {
        let piv = (col..N).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        for row in col + 1..N {
            let f = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (x, p) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *x -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; N];
    for i in (0..N).rev() {
        let s: f64 = (i + 1..N).map(|k| a[i][k] * x[k]).sum();
        x[i] = (b[i] - s) / a[i][i];
    }
    Some(x)
}
