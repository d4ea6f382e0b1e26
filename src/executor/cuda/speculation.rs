//! Speculative decoding's state on the CUDA backend (see `backend`'s module docs): the
//! proposer, each step's proposals, and their verification from the device's draws
//! (`executor::verify::DeviceDraws`).

use std::time::Instant;

use super::forward::Forward;
use super::options::CudaBackendOptions;
use crate::executor::input_batch::InputBatch;
use crate::executor::verify::{DeviceDraws, ForcedAcceptance, HostSampler, Logits, StepDrafts};
use crate::spec::{Proposer, SpecConfig};
use crate::step::{BatchInput, SampledToken, SpecOutput, StepOutput};

/// Speculative decoding on the CUDA backend: the proposer, this step's proposals, and the host
/// side of a draft model's sampled verifications (their logit rows, reused).
#[derive(Default)]
pub(super) struct Speculation {
    pub proposer: Option<Box<dyn Proposer>>,
    pub drafts: StepDrafts,
    host_sampler: HostSampler,
    dense: Vec<f32>,
    /// Benchmarks only (`CudaBackend::force_acceptance`): verification outcomes drawn at a
    /// set rate instead of compared with the target's draws. None in serving.
    pub forced: Option<ForcedAcceptance>,
}

impl Speculation {
    pub fn new(proposer: Option<Box<dyn Proposer>>) -> Self {
        Speculation {
            proposer,
            ..Speculation::default()
        }
    }

    /// Proposes drafts for the applied step's requests with draft positions (`input`), into
    /// `self.drafts`; what it cost into `out`.
    pub fn propose(&mut self, input: &InputBatch, out: &mut SpecOutput) -> anyhow::Result<()> {
        self.drafts.clear();
        let Some(p) = self.proposer.as_mut() else {
            return Ok(());
        };
        let reqs = input.propose_requests();
        if reqs.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let stats = p.propose(&reqs, &mut self.drafts.proposals)?;
        self.drafts.ids.extend(reqs.iter().map(|r| r.id));
        out.elapsed = t.elapsed();
        (out.passes, out.tokens) = (stats.passes, stats.tokens);
        Ok(())
    }

    /// The step's tokens from the device's draws `rows` (one per logit row of `batch`, the
    /// last launch of `fwd`): as they are without drafts, else verified (`DeviceDraws`).
    pub fn verify(
        &mut self,
        fwd: &Forward,
        batch: &BatchInput,
        rows: Vec<SampledToken>,
        out: &mut StepOutput,
    ) -> anyhow::Result<()> {
        if self.drafts.is_empty() {
            out.sampled = rows;
            return Ok(());
        }
        let draws = DeviceDraws {
            batch,
            rows: &rows,
            drafts: &self.drafts,
        };
        if let Some(f) = self.forced.as_mut() {
            draws.verify_forced(f, out);
            return Ok(());
        }
        let dense_rows = draws.dense_rows();
        self.dense.clear();
        fwd.logit_rows(&dense_rows, &mut self.dense)?;
        let vocab = fwd.cfg.vocab_size;
        let logits = Logits {
            data: &self.dense,
            vocab,
            sample_vocab: fwd.opts.sampled_vocab(vocab),
        };
        draws.verify(&mut self.host_sampler, logits, out);
        Ok(())
    }
}

/// The sampler's buffers must hold every draft the scheduler may give (`max_drafts`).
pub(super) fn check_spec_options(
    opts: &CudaBackendOptions,
    spec: &SpecConfig,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !spec.enabled() || opts.max_drafts >= spec.max_depth,
        "speculative depth {} needs CudaBackendOptions::max_drafts >= it (got {})",
        spec.max_depth,
        opts.max_drafts
    );
    Ok(())
}
