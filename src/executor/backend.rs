//! The one trait every executor backend (CPU on candle, CUDA on cudarc) implements.

use crate::step::{BatchInput, StepOutput};

#[derive(Debug, Clone)]
pub struct BackendInfo {
    /// "cpu" or "cuda:0 (NVIDIA H200)".
    pub device: String,
    /// KV blocks the backend allocated its pool for.
    pub num_kv_blocks: usize,
    pub block_size: usize,
    /// Bytes of one block across all layers, K and V.
    pub bytes_per_block: usize,
}

/// A backend runs on the executor's own thread; it is moved there once and never shared.
pub trait Backend: Send + 'static {
    fn info(&self) -> BackendInfo;

    /// Runs one step: writes the batch's K/V into the paged pool through `slot_mapping`, computes
    /// logits at each sampled sequence's last position, and samples one token for each.
    fn execute(&mut self, batch: &BatchInput) -> anyhow::Result<StepOutput>;
}
