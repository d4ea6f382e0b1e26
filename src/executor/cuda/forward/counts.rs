//! The device-kept token counts of requests with penalties (`Activations::counts`, read and
//! bumped by the sample kernel): the persistent batch's `CountOp`s applied on the stream before
//! the step that needs them.

use super::{Forward, COUNT_UPDATE_CHUNK};
use crate::executor::cuda::kernels::{
    self, CountUpdate, SampleCountsMoveParams, SampleCountsUpdateParams, COUNT_PROMPT,
};
use crate::executor::input_batch::CountOp;

impl Forward {
    /// Applies the token-count changes of requests with penalties, in order (the persistent
    /// batch's `CountOp`s): row moves, clears, then the prompt marks and count changes, in
    /// launches of at most `COUNT_UPDATE_CHUNK`.
    pub fn apply_count_ops(&mut self, ops: &[CountOp]) -> anyhow::Result<()> {
        let vocab = self.cfg.vocab_size;
        let row_bytes = vocab * 4;
        let mut pending = std::mem::take(&mut self.count_updates_host);
        pending.clear();
        let mut res = Ok(());
        for op in ops {
            let at = |row: usize, token: u32| (row * vocab + token as usize) as u32;
            let update = match *op {
                CountOp::Prompt { row, token } => Some(CountUpdate {
                    index: at(row, token),
                    delta: COUNT_PROMPT,
                }),
                CountOp::Add { row, token, delta } => Some(CountUpdate {
                    index: at(row, token),
                    delta,
                }),
                CountOp::Move { .. } | CountOp::Clear { .. } => None,
            };
            let row = match *op {
                CountOp::Move { from, to } => from.max(to),
                CountOp::Clear { row } | CountOp::Prompt { row, .. } | CountOp::Add { row, .. } => {
                    row
                }
            };
            if row >= self.max_seqs
                || matches!(update, Some(u) if u.index as usize >= self.max_seqs * vocab)
            {
                res = Err(anyhow::anyhow!(
                    "token counts of row {row} (token out of range?); the CUDA backend has {} rows of {vocab}",
                    self.max_seqs
                ));
                break;
            }
            match (update, *op) {
                (Some(u), _) => {
                    pending.push(u);
                    if pending.len() == COUNT_UPDATE_CHUNK {
                        res = self.flush_count_updates(&mut pending);
                    }
                }
                // Moves and clears order against the updates before them.
                (None, CountOp::Move { from, to }) => {
                    res = self.flush_count_updates(&mut pending).and_then(|()| {
                        let p = SampleCountsMoveParams {
                            counts: self.act.counts.ptr(),
                            from: from as i32,
                            to: to as i32,
                            vocab: vocab as i32,
                        };
                        // SAFETY: both rows are below max_seqs (checked above).
                        unsafe { kernels::sample_counts_move(&self.gpu, &p) }
                    });
                }
                (None, _) => {
                    res = self.flush_count_updates(&mut pending).and_then(|()| {
                        let CountOp::Clear { row } = *op else {
                            unreachable!("only moves and clears carry no update")
                        };
                        let ptr = self.act.counts.ptr() + (row * row_bytes) as u64;
                        self.gpu.memset(ptr, 0, row_bytes)
                    });
                }
            }
            if res.is_err() {
                break;
            }
        }
        if res.is_ok() {
            res = self.flush_count_updates(&mut pending);
        }
        self.count_updates_host = pending;
        res
    }

    fn flush_count_updates(&mut self, pending: &mut Vec<CountUpdate>) -> anyhow::Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        // The upload is staged before it returns, so `pending` can be refilled at once.
        self.gpu.upload(self.act.count_updates.ptr(), pending)?;
        let p = SampleCountsUpdateParams {
            counts: self.act.counts.ptr(),
            updates: self.act.count_updates.ptr(),
            num_updates: pending.len() as i32,
        };
        pending.clear();
        // SAFETY: every index was checked against the counts' size by apply_count_ops.
        unsafe { kernels::sample_counts_update(&self.gpu, &p) }
    }
}
