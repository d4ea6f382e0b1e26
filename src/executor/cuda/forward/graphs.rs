//! CUDA graphs of the forward: a pure-decode step's (padded to a batch-size bucket) or, with
//! `CudaBackendOptions::verify_graphs`, a verification step's (padded to (bucket, k)), captured
//! on the shape's first use and replayed after the step's metadata upload and table update.

use anyhow::Context;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::{DecodeGraph, Forward, GraphKey};
use crate::executor::cuda::step_meta::{GraphShape, Step};

impl Forward {
    /// Launches the graph of `step` (packed for `shape`, `real` sequences before the padding),
    /// capturing it first on the key's first use.
    pub(super) fn replay(
        &mut self,
        shape: GraphShape,
        step: &Step,
        real: usize,
    ) -> anyhow::Result<()> {
        let splits = if step.nd > 0 { step.splits } else { 0 };
        let key: GraphKey = (shape, splits, step.prefill_splits);
        if !self.graphs.contains_key(&key) {
            let graph = self.capture(step)?;
            self.graphs.insert(key, graph);
        }
        self.graphs[&key]
            .0
            .launch()
            .context("launching a decode graph")?;
        if shape.drafts > 0 {
            self.verify_graph_steps.0 += 1;
            self.verify_graph_steps.1 += u64::from(shape.bucket > real);
        }
        Ok(())
    }

    /// Captures the forward of `step` (its layout is the shape's) into a graph.
    fn capture(&self, step: &Step) -> anyhow::Result<DecodeGraph> {
        let stream = &self.gpu.stream;
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        // SAFETY: pack() sized the step; the metadata is uploaded before every launch.
        let enqueued = unsafe { self.enqueue(step) };
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        enqueued.context("capturing a decode step")?;
        let graph = graph
            .context("instantiating a decode graph")?
            .context("capture produced no graph")?;
        Ok(DecodeGraph(graph))
    }
}
