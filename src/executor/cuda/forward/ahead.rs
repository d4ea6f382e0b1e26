//! Lookahead decode's launches (`CudaBackendOptions::lookahead`): which step to launch ahead
//! and whether the plan is it are decided in `executor::cuda::lookahead` (pure, CPU-tested).

use anyhow::Context;

use super::{Ahead, Forward};
use crate::executor::cuda::lookahead;
use crate::step::BatchInput;

impl Forward {
    /// Lookahead: runs `batch`, the scheduler's plan (of the persistent batch), as the step
    /// launched ahead when it is exactly that step and the plan changes no block table and no
    /// token count (`counts_changed`: their updates were enqueued after the step launched
    /// ahead), else launches it. `idle_s`: how long ago the last step's results went back
    /// (the gate's measure of what an unused step cost).
    pub fn launch_or_keep(
        &mut self,
        batch: &BatchInput,
        updates: &[(u32, u32)],
        counts_changed: bool,
        idle_s: f64,
    ) -> anyhow::Result<()> {
        let changed = !updates.is_empty() || counts_changed;
        // The prediction the gate held back is judged like a launched one, for the gate only.
        if let Some(held) = self.held.take() {
            self.judge(&held, batch, changed, idle_s);
            self.spare = held;
        }
        if let Some(ahead) = self.ahead.take() {
            let keep = self.judge(&ahead.batch, batch, changed, idle_s);
            self.spare = ahead.batch;
            if keep {
                self.lookahead_stats.hits += 1;
                self.cur = Some(ahead.launched);
                return Ok(());
            }
            self.lookahead_stats.misses += 1;
        }
        self.launch_step(batch, updates, true, true, false)?;
        Ok(())
    }

    /// Whether `predicted` is kept for the plan `batch` (`lookahead::keep`), told to the gate.
    fn judge(
        &mut self,
        predicted: &BatchInput,
        batch: &BatchInput,
        changed: bool,
        idle_s: f64,
    ) -> bool {
        let kept = lookahead::keep(predicted, batch, &self.fed, changed).is_ok();
        if let Some(g) = &mut self.gate {
            g.record(kept, idle_s);
        }
        kept
    }

    /// Lookahead: launches the step predicted to follow `batch` (launched last) behind it, its
    /// input tokens fed on the device from `batch`'s samples, unless the gate holds it back.
    /// `sampled` still reads `batch`'s.
    pub fn launch_ahead(&mut self, batch: &BatchInput) -> anyhow::Result<()> {
        let mut pred = std::mem::take(&mut self.spare);
        let max_context = self.max_blocks * self.opts.block_size;
        if lookahead::predict(batch, self.opts.block_size, max_context, &mut pred).is_err() {
            self.lookahead_stats.unpredictable += 1;
            self.spare = pred;
            return Ok(());
        }
        if self.gate.as_ref().is_some_and(|g| !g.open()) {
            self.lookahead_stats.held += 1;
            self.held = Some(pred);
            return Ok(());
        }
        let cur = self.cur;
        // A prediction has no row with penalties (`lookahead::predict`): the step launched
        // ahead neither reads nor bumps the token counts.
        let res = self.launch_step(&pred, &[], true, true, true);
        let launched = std::mem::replace(&mut self.cur, cur);
        res?;
        self.lookahead_stats.launched += 1;
        self.ahead = Some(Ahead {
            batch: pred,
            launched: launched.context("a launch records itself")?,
        });
        Ok(())
    }

    /// Lookahead: `batch` took `s` seconds (a pure-decode step's time is what the gate weighs
    /// an unused one at).
    pub fn observe_step(&mut self, batch: &BatchInput, s: f64) {
        if let Some(g) = self
            .gate
            .as_mut()
            .filter(|_| lookahead::is_decode_step(batch))
        {
            g.observe_step(s);
        }
    }

    /// Forgets the step launched ahead, if any: it finishes on the stream, unused (harmless:
    /// see `lookahead`); and the prediction the gate held back.
    pub fn drop_ahead(&mut self) {
        if let Some(h) = self.held.take() {
            self.spare = h;
        }
        if let Some(a) = self.ahead.take() {
            self.lookahead_stats.misses += 1;
            self.spare = a.batch;
        }
    }
}
