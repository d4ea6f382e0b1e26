//! A backend that computes nothing (`brook bench --engine-loop`): it applies each step to its
//! persistent input batch as a real backend does (the diffs are checked), then each sampling
//! sequence samples the same token, after keeping the executor thread busy for a set time (as a
//! GPU step's wait does). What a step takes beyond that is the engine's own: the scheduler
//! actor, the hand-overs to the executor thread and back.

use std::time::{Duration, Instant};

use crate::executor::backend::{Backend, BackendInfo};
use crate::executor::input_batch::InputBatch;
use crate::step::{SampledToken, SchedulerOutput, StepOutput};

pub struct NullBackend {
    input: InputBatch,
    block_size: usize,
    num_kv_blocks: usize,
    token: u32,
    step_time: Duration,
}

impl NullBackend {
    /// A pool of `num_kv_blocks` blocks of `block_size` tokens (nothing is allocated), sequences
    /// of at most `max_len` tokens; every sample is `token`; each step keeps the executor
    /// thread busy for `step_time` (a GPU step's wait).
    pub fn new(
        block_size: usize,
        num_kv_blocks: usize,
        max_len: usize,
        token: u32,
        step_time: Duration,
    ) -> Self {
        NullBackend {
            input: InputBatch::new(block_size, num_kv_blocks, max_len.div_ceil(block_size)),
            block_size,
            num_kv_blocks,
            token,
            step_time,
        }
    }
}

impl Backend for NullBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            device: "null (no model)".into(),
            num_kv_blocks: self.num_kv_blocks,
            block_size: self.block_size,
            bytes_per_block: 0,
            num_host_blocks: 0,
            copy_bytes_per_s: 0.0,
        }
    }

    fn execute(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput> {
        let started = Instant::now();
        let batch = self.input.update(step)?;
        anyhow::ensure!(
            batch.num_drafts() == 0,
            "the null backend does not verify drafts"
        );
        let sampled = batch
            .seqs
            .iter()
            .filter(|s| s.sample.is_some())
            .map(|s| SampledToken {
                request_id: s.request_id,
                token: self.token,
                logprob: 0.0,
            })
            .collect();
        // A GPU step's wait: the executor thread stays busy (the CUDA backend spins on its
        // event) for the step's time.
        while started.elapsed() < self.step_time {
            std::hint::spin_loop();
        }
        let mut out = StepOutput {
            sampled,
            ..StepOutput::default()
        };
        self.input.record(&out)?;
        out.elapsed = started.elapsed();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sampling::params::SamplingParams;
    use crate::step::ScheduledRequest;

    /// A prefill chunk that does not sample and one that does: only the second gets the token,
    /// after the step held the thread for its time; a diff it cannot apply is refused.
    #[test]
    fn samples_its_token_for_each_sampling_sequence_after_its_step_time() {
        let mut b = NullBackend::new(4, 16, 32, 7, Duration::from_micros(500));
        let params = Arc::new(SamplingParams::greedy(5));
        let mut chunk = ScheduledRequest::first(1, vec![10; 6], 6, vec![0, 1], params.clone(), 1);
        chunk.num_tokens = 3;
        chunk.sample = false;
        let whole = ScheduledRequest::first(2, vec![11; 3], 3, vec![2], params, 2);
        let step = SchedulerOutput {
            scheduled: vec![chunk, whole],
            ..SchedulerOutput::default()
        };
        let started = Instant::now();
        let out = b.execute(&step).unwrap();
        assert!(started.elapsed() >= Duration::from_micros(500));
        assert!(out.elapsed >= Duration::from_micros(500));
        let got: Vec<(u64, u32)> = out
            .sampled
            .iter()
            .map(|s| (s.request_id.0, s.token))
            .collect();
        assert_eq!(got, vec![(2, 7)]);
        // Sent as new again: the persistent batch refuses it.
        assert!(b.execute(&step).is_err());
        assert_eq!(b.info().num_kv_blocks, 16);
    }
}
