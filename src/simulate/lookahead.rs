//! Lookahead decode on simulated time (`brook simulate --lookahead GAIN_US`): the CUDA backend's
//! own rules (`executor::cuda::lookahead::{predict, keep}`) applied to the simulated step
//! stream, to see what the option would gain or lose under a workload's churn before the GPU
//! runs it.
//!
//! After each step the model predicts the next one as the backend does, and launches it unless
//! the backend's `Gate` (`--lookahead-auto`) is closed. When the plan that
//! follows is kept, that step ends `gain_us` sooner (the host gap that lookahead hides: the GPU
//! ran it while the host planned it). When it is missed, the step launched ahead runs unused
//! first (its time from the cost model, without noise), and the plan's step ends later by what
//! is left of it when the plan starts: all of it when the plan follows at once, nothing when
//! the GPU went idle for longer (the last request finished and the next came later). The host
//! work that overlapped the unused step is not subtracted (at most one host gap), so a miss
//! costs slightly more here than on the GPU.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::executor::cuda::lookahead::{self, Gate, Miss, Unforeseen};
use crate::scheduler::{CostCoefficients, StepFeatures};
use crate::step::BatchInput;

/// Lookahead as modelled in a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LookaheadSetup {
    /// Host time a kept step hides, µs.
    pub gain_us: f64,
    /// Launch only while the backend's `Gate` is open (`model.cuda_lookahead = "auto"`).
    pub gated: bool,
}

/// What lookahead did in a simulated run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LookaheadReport {
    /// Host time a kept step hides, µs (the flag's value).
    pub gain_us: f64,
    /// Gated (`Gate`): launched only while it pays.
    pub gated: bool,
    /// Predicted but not launched: the gate was closed.
    pub held: u64,
    /// Steps launched ahead.
    pub launched: u64,
    /// Launched ahead and kept.
    pub kept: u64,
    /// Launched ahead and finished unused, by why.
    pub missed: BTreeMap<&'static str, u64>,
    /// Steps after which nothing was launched ahead, by why.
    pub unforeseen: BTreeMap<&'static str, u64>,
    /// Host time hidden by kept steps, s.
    pub saved_s: f64,
    /// GPU time of the steps that finished unused, s.
    pub wasted_s: f64,
}

impl LookaheadReport {
    fn new(gain_us: f64, gated: bool) -> Self {
        LookaheadReport {
            gain_us,
            gated,
            missed: Miss::ALL.iter().map(|m| (m.as_str(), 0)).collect(),
            unforeseen: Unforeseen::ALL.iter().map(|u| (u.as_str(), 0)).collect(),
            ..LookaheadReport::default()
        }
    }

    /// Kept / launched (1 when nothing was launched).
    pub fn hit_rate(&self) -> f64 {
        if self.launched == 0 {
            1.0
        } else {
            self.kept as f64 / self.launched as f64
        }
    }

    pub fn missed_total(&self) -> u64 {
        self.missed.values().sum()
    }
}

/// The step predicted after the last one, its modelled GPU time, when it would finish if
/// launched (simulated seconds), and whether it was.
struct Pending {
    batch: BatchInput,
    fed: Vec<u32>,
    time_s: f64,
    ends_s: f64,
    launched: bool,
}

pub struct LookaheadModel {
    gain_s: f64,
    block_size: usize,
    max_context: usize,
    /// None: launch every prediction.
    gate: Option<Gate>,
    pending: Option<Pending>,
    spare: BatchInput,
    report: LookaheadReport,
}

impl LookaheadModel {
    pub fn new(setup: LookaheadSetup, block_size: usize, max_context: usize) -> Self {
        let LookaheadSetup { gain_us, gated } = setup;
        LookaheadModel {
            gain_s: gain_us * 1e-6,
            block_size,
            max_context,
            gate: gated.then(|| Gate::new(gain_us)),
            pending: None,
            spare: BatchInput::default(),
            report: LookaheadReport::new(gain_us, gated),
        }
    }

    /// The plan `batch` (with `changed`: it changes a block table) starts at `now_s`: how much
    /// sooner (negative) or later its step ends than without lookahead. A missed step delays
    /// it by what is left of the unused step then (nothing after an idle spell).
    pub fn on_plan(&mut self, batch: &BatchInput, changed: bool, now_s: f64) -> f64 {
        let Some(p) = self.pending.take() else {
            return 0.0;
        };
        let verdict = lookahead::keep(&p.batch, batch, &p.fed, changed);
        self.spare = p.batch;
        if let Some(g) = &mut self.gate {
            g.record(verdict.is_ok(), now_s - (p.ends_s - p.time_s));
        }
        if !p.launched {
            return 0.0;
        }
        match verdict {
            Ok(()) => {
                self.report.kept += 1;
                self.report.saved_s += self.gain_s;
                -self.gain_s
            }
            Err(why) => {
                *self.report.missed.entry(why.as_str()).or_default() += 1;
                let delay = (p.ends_s - now_s).clamp(0.0, p.time_s);
                self.report.wasted_s += delay;
                delay
            }
        }
    }

    /// `batch` was launched, sampled `sampled` (one token per sequence, in order), took
    /// `last_step_s` and ends at `ends_s`: launches the step expected next, if it can be
    /// foreseen and the gate is open.
    pub fn on_launch(
        &mut self,
        batch: &BatchInput,
        sampled: &[u32],
        last_step_s: f64,
        ends_s: f64,
        cost: &CostCoefficients,
    ) {
        if let Some(g) = self
            .gate
            .as_mut()
            .filter(|_| lookahead::is_decode_step(batch))
        {
            g.observe_step(last_step_s);
        }
        let mut pred = std::mem::take(&mut self.spare);
        match lookahead::predict(batch, self.block_size, self.max_context, &mut pred) {
            Ok(()) => {
                let mut f = StepFeatures::default();
                for q in &pred.seqs {
                    f.add_seq(q.query_len, q.context_len);
                }
                let launched = self.gate.as_ref().is_none_or(Gate::open);
                if launched {
                    self.report.launched += 1;
                } else {
                    self.report.held += 1;
                }
                let time_s = cost.predict_ms(&f) / 1e3;
                self.pending = Some(Pending {
                    time_s,
                    ends_s: ends_s + time_s,
                    fed: sampled.to_vec(),
                    batch: pred,
                    launched,
                });
            }
            Err(why) => {
                *self.report.unforeseen.entry(why.as_str()).or_default() += 1;
                self.spare = pred;
            }
        }
    }

    /// A step launched ahead when the run ended finishes unused, on an idle GPU.
    pub fn finish(mut self) -> LookaheadReport {
        if self.pending.take().is_some_and(|p| p.launched) {
            *self.report.missed.entry(Miss::Left.as_str()).or_default() += 1;
        }
        self.report
    }
}
