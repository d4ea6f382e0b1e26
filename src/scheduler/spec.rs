//! Adaptive speculation depth: how many draft positions each decode gets this step (k in
//! 0..=max), from the engine's state and two cost estimates. Pure functions and small online
//! fits; the core calls them while it schedules decodes (`core/spec.rs`).
//!
//! Rules first (the seed's): no speculation while KV usage is above `max_kv_usage` (60%), at
//! most `emergency_max_depth` (1) in emergency mode, none for a request that opted out, none
//! before the step-time fit has seen `MIN_FIT_STEPS` steps (its fallback coefficients describe
//! another machine).
//!
//! Then the cost model. With per-token acceptance α_i (a request's EMA), depth K yields
//! E_i(K) = 1 + α_i + … + α_i^K tokens per request. A step with B decodes of which n may
//! speculate costs T(K) = target(B decodes + K·n verification tokens) + draft(K passes, K·n
//! tokens): the target part from the step-time fit of steps without drafts plus a fit of what
//! verifying adds (a fixed cost once a step has drafts, and a cost per row: `VerifyCost`),
//! the draft part from its own fit. The cap K
//! maximises tokens per millisecond, Σ E_i(K) / T(K), so at a large batch, where a query row
//! costs about what a whole decode does, verification costs more than it saves and K is 0.
//! Each request then keeps draft j only while its expected gain α_i^j pays the marginal cost
//! of one more position at that rate.

use serde::Serialize;

use crate::scheduler::cost_model::{CostModel, StepFeatures};
use crate::spec::SpecConfig;

/// Steps the target's step-time fit needs before speculation starts.
pub const MIN_FIT_STEPS: u64 = 8;

/// Why the depth ceiling is what it is this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ceiling {
    /// Speculation is off (`--speculative off`).
    Off,
    /// KV usage above `max_kv_usage`.
    KvPressure,
    /// The step-time fit is not ready.
    Warmup,
    /// Emergency mode: at most `emergency_max_depth`.
    Emergency,
    Normal,
}

impl Ceiling {
    pub const ALL: [Ceiling; 5] = [
        Ceiling::Off,
        Ceiling::KvPressure,
        Ceiling::Warmup,
        Ceiling::Emergency,
        Ceiling::Normal,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Ceiling::Off => "off",
            Ceiling::KvPressure => "kv_pressure",
            Ceiling::Warmup => "warmup",
            Ceiling::Emergency => "emergency",
            Ceiling::Normal => "normal",
        }
    }
}

/// Speculation counters since start, in vLLM's terms, for the metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SpecStats {
    /// Verifications: a sequence's step with at least one draft (vLLM's `num_drafts`).
    pub num_drafts: u64,
    /// Draft tokens proposed and accepted.
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// By draft position (0: the first draft): drafts accepted there, and proposed there.
    pub accepted_per_pos: Vec<u64>,
    pub proposed_per_pos: Vec<u64>,
    /// Steps with decodes, by what set the depth ceiling.
    pub steps_by_ceiling: [u64; 5],
    /// Mean depth given to the decodes that could speculate in the last such step.
    pub current_depth: f64,
}

impl SpecStats {
    /// One sequence's verification: `accepted` of `proposed` drafts.
    pub fn observe(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += proposed as u64;
        self.num_accepted_tokens += accepted as u64;
        if self.proposed_per_pos.len() < proposed {
            self.proposed_per_pos.resize(proposed, 0);
            self.accepted_per_pos.resize(proposed, 0);
        }
        for j in 0..proposed {
            self.proposed_per_pos[j] += 1;
            if j < accepted {
                self.accepted_per_pos[j] += 1;
            }
        }
    }

    /// Tokens per verification, the target's own included (vLLM's mean acceptance length);
    /// None before any.
    pub fn mean_accepted_length(&self) -> Option<f64> {
        (self.num_drafts > 0)
            .then(|| 1.0 + self.num_accepted_tokens as f64 / self.num_drafts as f64)
    }

    /// Accepted / proposed drafts; None before any.
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.num_draft_tokens > 0)
            .then(|| self.num_accepted_tokens as f64 / self.num_draft_tokens as f64)
    }
}

/// The depth ceiling the rules allow: `(max depth, why)`.
pub fn ceiling(
    cfg: &SpecConfig,
    kv_usage: f64,
    emergency: bool,
    fit_steps: u64,
) -> (usize, Ceiling) {
    if !cfg.enabled() {
        (0, Ceiling::Off)
    } else if kv_usage > cfg.max_kv_usage {
        (0, Ceiling::KvPressure)
    } else if fit_steps < MIN_FIT_STEPS {
        (0, Ceiling::Warmup)
    } else if emergency {
        (
            cfg.max_depth.min(cfg.emergency_max_depth),
            Ceiling::Emergency,
        )
    } else {
        (cfg.max_depth, Ceiling::Normal)
    }
}

/// Expected tokens from one verification of `k` drafts at per-token acceptance `alpha`: the
/// accepted prefix plus the target's own token, 1 + α + … + α^k.
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    let mut term = 1.0;
    let mut sum = 1.0;
    for _ in 0..k {
        term *= alpha;
        sum += term;
    }
    sum
}

/// Held steps before a request held at depth 0 is first probed again.
pub const PROBE_FIRST: u32 = 4;
/// The longest back-off between probes of a request whose probes keep failing.
pub const PROBE_MAX: u32 = 64;
/// The acceptance a due probe is planned at (see `Scheduler::retry_rate`).
pub const PROBE_ACCEPTANCE: f64 = 0.9;
/// Drafts in a probe: enough to see whether the text became predictable, few enough that a
/// failed probe wastes little.
pub const PROBE_DEPTH: usize = 2;

/// A request's per-token acceptance: EMAs of the drafts it got accepted and the drafts that
/// were tested per step (a draft after the first rejection is never tested), so that
/// accepted / tested estimates α whatever the depth.
///
/// A request its estimate holds at depth 0 is re-probed by exponential back-off: after
/// `PROBE_FIRST` held steps it is planned at the optimistic acceptance and drafts at most
/// `PROBE_DEPTH` positions (if the step's cost model says that pays even then — at a large
/// batch it does not, and nothing is drafted); a probe that is fully accepted resets the
/// interval, one that is not doubles it up to `PROBE_MAX`. Why not let the estimate drift back
/// by itself: acceptance is not stationary (on the CPU pair at temperature 0.7, α ≈ 0.1–0.4 for
/// the first ≈ 40 tokens and near 1 after), and a slow drift missed the second phase, while a
/// fast one wasted verifications on text that stays unpredictable. The back-off re-measures in
/// O(log n) probes over n held steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    accepted: f64,
    tested: f64,
    /// The request's length when it last got drafts (0: never): the draft model has computed
    /// about that much of it, and catches up on the rest before it drafts again.
    pub synced: usize,
    /// Steps held at depth 0 since it last drafted, and the back-off before the next probe.
    held: u32,
    interval: u32,
    /// Its last drafts were a probe (the back-off learns from their verification).
    probing: bool,
}

impl Acceptance {
    pub fn new(prior: f64) -> Self {
        Acceptance {
            accepted: prior,
            tested: 1.0,
            synced: 0,
            held: 0,
            interval: PROBE_FIRST,
            probing: false,
        }
    }

    pub fn rate(&self) -> f64 {
        (self.accepted / self.tested).clamp(0.0, 1.0)
    }

    /// `accepted` of `proposed` drafts were accepted in one step.
    pub fn observe(&mut self, proposed: usize, accepted: usize, weight: f64) {
        if proposed == 0 {
            return;
        }
        let tested = (accepted + 1).min(proposed);
        self.accepted += weight * (accepted as f64 - self.accepted);
        self.tested += weight * (tested as f64 - self.tested);
        if std::mem::take(&mut self.probing) {
            self.interval = match accepted == proposed {
                true => PROBE_FIRST,
                false => (self.interval * 2).min(PROBE_MAX),
            };
        }
    }

    /// Held long enough that its next step probes.
    pub fn probe_due(&self) -> bool {
        self.held >= self.interval
    }

    /// Steps held at depth 0 since it last drafted.
    pub fn held_steps(&self) -> u32 {
        self.held
    }

    /// Steps to wait between probes now.
    pub fn probe_interval(&self) -> u32 {
        self.interval
    }

    /// A step in which the request could have drafted and got no drafts.
    pub fn hold(&mut self) {
        self.held = self.held.saturating_add(1);
    }

    /// The request got drafts this step (`probe`: because its probe was due). Drafting on its
    /// own estimate resets the back-off.
    pub fn drafted(&mut self, probe: bool) {
        self.held = 0;
        self.probing = probe;
        if !probe {
            self.interval = PROBE_FIRST;
        }
    }
}

/// Online fit of the draft's time per step: `ms = per_pass · passes + per_token · tokens`
/// (ridge least squares with forgetting, non-negative). It starts at zero cost, so drafting is
/// tried and then measured.
#[derive(Debug, Clone)]
pub struct DraftCost {
    xtx: [[f64; 2]; 2],
    xty: [f64; 2],
    coef: [f64; 2],
    samples: u64,
}

const DRAFT_FORGETTING: f64 = 0.98;

impl Default for DraftCost {
    fn default() -> Self {
        DraftCost {
            xtx: [[0.0; 2]; 2],
            xty: [0.0; 2],
            coef: [0.0; 2],
            samples: 0,
        }
    }
}

impl DraftCost {
    pub fn per_pass_ms(&self) -> f64 {
        self.coef[0]
    }

    pub fn per_token_ms(&self) -> f64 {
        self.coef[1]
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn predict_ms(&self, passes: usize, tokens: usize) -> f64 {
        self.coef[0] * passes as f64 + self.coef[1] * tokens as f64
    }

    /// One step's drafting: `passes` forward passes over `tokens` tokens in `ms`.
    pub fn observe(&mut self, passes: usize, tokens: usize, ms: f64) {
        if !ms.is_finite() || ms < 0.0 || (passes == 0 && tokens == 0) {
            return;
        }
        let x = [passes as f64, tokens as f64];
        for i in 0..2 {
            for j in 0..2 {
                self.xtx[i][j] = DRAFT_FORGETTING * self.xtx[i][j] + x[i] * x[j];
            }
            self.xty[i] = DRAFT_FORGETTING * self.xty[i] + x[i] * ms;
        }
        self.samples += 1;
        // Ridge relative to each feature's energy: collinear steps (always the same shape) still
        // split the time between the two.
        let w = |i: usize| 1e-3 * self.xtx[i][i] + 1e-9;
        let a = [
            [self.xtx[0][0] + w(0), self.xtx[0][1]],
            [self.xtx[1][0], self.xtx[1][1] + w(1)],
        ];
        let det = a[0][0] * a[1][1] - a[0][1] * a[1][0];
        if det.abs() < 1e-300 {
            return;
        }
        let c0 = (self.xty[0] * a[1][1] - a[0][1] * self.xty[1]) / det;
        let c1 = (a[0][0] * self.xty[1] - a[1][0] * self.xty[0]) / det;
        self.coef = match (c0 >= 0.0, c1 >= 0.0) {
            (true, true) => [c0, c1],
            // One coefficient pinned at 0: the other alone.
            _ if c0 < 0.0 => [0.0, (self.xty[1] / a[1][1]).max(0.0)],
            _ => [(self.xty[0] / a[0][0]).max(0.0), 0.0],
        };
    }
}

/// Online fit of what verification adds to the target's step:
/// `ms = fixed · [any drafts] + per_row · rows`, over the excess of a verifying step's target
/// time above what the same step costs without drafts (the k = 0 fit's prediction).
///
/// Why a fixed term: the excess is not linear in rows from 0. Traced on the CPU pair (single
/// stream, 1 × 64 / 256, medians of ≈ 300 steps, propose included): k = 0 0.60 ms, k = 1 1.14,
/// k = 2 1.44, k = 3 1.68, k = 4 2.00 — the first verified row costs ≈ 0.36 ms (the step leaves
/// the one-row kernel path), each further one ≈ 0.13. A single linear fit over every step put
/// that jump into the step's base (k = 0 predicted at 0.85 ms, measured 0.60), so it both
/// overpriced not speculating and underpriced k = 1, where a step costs more per token than off.
#[derive(Debug, Clone, Default)]
pub struct VerifyCost(DraftCost);

impl VerifyCost {
    /// Samples before the fit replaces the target fit's per-row coefficient.
    pub const MIN_SAMPLES: u64 = 4;

    pub fn fixed_ms(&self) -> f64 {
        self.0.per_pass_ms()
    }

    pub fn per_row_ms(&self) -> f64 {
        self.0.per_token_ms()
    }

    pub fn samples(&self) -> u64 {
        self.0.samples()
    }

    pub fn is_fitted(&self) -> bool {
        self.samples() >= Self::MIN_SAMPLES
    }

    /// What `rows` draft rows add to a step (0 without rows).
    pub fn predict_ms(&self, rows: usize) -> f64 {
        match rows {
            0 => 0.0,
            _ => self.0.predict_ms(1, rows),
        }
    }

    /// One verifying step: `rows` draft rows made the target's time `excess_ms` longer than the
    /// k = 0 fit predicts (clamped at 0: noise can put a step below its prediction).
    pub fn observe(&mut self, rows: usize, excess_ms: f64) {
        if rows > 0 && excess_ms.is_finite() {
            self.0.observe(1, rows, excess_ms.max(0.0));
        }
    }
}

/// The depth of one step: the cap, and what a request needs to use it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DepthChoice {
    /// Most drafts any request gets.
    pub cap: usize,
    /// Expected tokens per millisecond of the step at `cap`.
    pub rate: f64,
    /// Cost of one more draft position for one request (verification + drafting), ms.
    pub marginal_ms: f64,
}

impl DepthChoice {
    pub const NONE: DepthChoice = DepthChoice {
        cap: 0,
        rate: 0.0,
        marginal_ms: 0.0,
    };

    /// Every request that may speculate gets `cap` drafts (`adaptive = false`).
    pub fn fixed(cap: usize) -> DepthChoice {
        DepthChoice {
            cap,
            ..DepthChoice::NONE
        }
    }

    /// Drafts for a request of per-token acceptance `alpha`: the j-th is worth it while its
    /// expected gain α^j pays one more position at the step's rate.
    pub fn depth_for(&self, alpha: f64) -> usize {
        let mut k = 0;
        let mut gain = 1.0;
        while k < self.cap {
            gain *= alpha;
            if gain < self.rate * self.marginal_ms {
                break;
            }
            k += 1;
        }
        k
    }
}

/// The step-time fits the depth choice prices a step with.
#[derive(Debug, Clone, Copy)]
pub struct Fits<'a> {
    /// Steps without drafts.
    pub target: &'a CostModel,
    /// What drafts add to the target's step.
    pub verify: &'a VerifyCost,
    /// The draft model's passes.
    pub draft: &'a DraftCost,
}

/// Speculating must beat not speculating by this factor in expected tokens per ms. The fits
/// are noisy on a loaded CPU, and some costs are not in them (the draft model's catch-up after
/// a hold beyond its estimate, the engine's work per verified token); measured on the CPU pair
/// at temperature 0.7 (per-draft acceptance ≈ 0.7, where k = 4 and k = 0 priced within a few
/// per cent of each other), drafting on a 1.0 margin ran at 0.88× of off (12 runs).
pub const MIN_GAIN: f64 = 1.05;

/// Chooses the cap (0..=`ceiling`) maximising expected tokens per ms of the step whose decodes
/// are `decodes` (features of a plain decode step), where the requests of acceptances `alphas`
/// may speculate and `others` decodes may not. Any speculation first costs the draft model
/// `catch_up` tokens (the parts of those requests it has not computed: whole prompts when they
/// never speculated; at batch 64 on the CPU that is several decode steps' time).
pub fn choose_depth(
    fits: Fits<'_>,
    decodes: &StepFeatures,
    alphas: &[f64],
    others: usize,
    catch_up: usize,
    ceiling: usize,
) -> DepthChoice {
    let Fits {
        target,
        verify,
        draft,
    } = fits;
    let n = alphas.len();
    if ceiling == 0 || n == 0 {
        return DepthChoice::NONE;
    }
    // A verification row is a query row through every layer: with several decodes it costs
    // at least what a decode's row does, whatever the fit's split between prefill and decode
    // (an online fit over steps of one shape can put the prefill coefficient at 0; measured on
    // the CPU at batch 64). With one decode the fit cannot tell the per-decode cost from the
    // step's base, so there the prefill coefficient alone prices a row.
    // Once verifying steps have been measured, their own fit prices them (fixed + per row);
    // before, the target fit's coefficients.
    let c = target.coefficients();
    let (fixed_ms, row_ms) = match (verify.is_fitted(), decodes.decode_seqs > 1.0) {
        (true, _) => (verify.fixed_ms(), verify.per_row_ms()),
        (false, true) => (0.0, c.per_prefill_token_ms.max(c.per_decode_seq_ms)),
        (false, false) => (0.0, c.per_prefill_token_ms),
    };
    let base_ms = target.predict_ms(decodes);
    let step_ms = |k: usize| match k {
        0 => base_ms,
        _ => base_ms + fixed_ms + row_ms * (k * n) as f64 + draft.predict_ms(k, k * n + catch_up),
    };
    let rate = |k: usize| {
        let tokens = others as f64 + alphas.iter().map(|&a| expected_tokens(a, k)).sum::<f64>();
        tokens / step_ms(k).max(1e-6)
    };
    let (mut best, mut best_rate) = (0, rate(0));
    for k in 1..=ceiling {
        let r = rate(k);
        let margin = if best == 0 { MIN_GAIN } else { 1.0 + 1e-9 };
        if r > best_rate * margin {
            (best, best_rate) = (k, r);
        }
    }
    DepthChoice {
        cap: best,
        rate: best_rate,
        marginal_ms: row_ms + draft.per_token_ms(),
    }
}

#[cfg(test)]
mod tests;
