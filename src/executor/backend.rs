//! The one trait every executor backend (CPU on candle, CUDA on cudarc) implements.

use crate::step::{SchedulerOutput, StepOutput};

#[derive(Debug, Clone)]
pub struct BackendInfo {
    /// "cpu", "cpu (tensor parallel: 2 ranks)" or "cuda:0 (NVIDIA H200)".
    pub device: String,
    /// KV blocks the backend allocated its pool for.
    pub num_kv_blocks: usize,
    pub block_size: usize,
    /// Bytes of one block across all layers, K and V: what it costs one device (under tensor
    /// parallelism a rank, which holds its KV heads of every block).
    pub bytes_per_block: usize,
    /// Blocks of the KV host tier (0: none), and the copy bandwidth between the tiers, bytes
    /// per second one way (measured at start, or configured).
    pub num_host_blocks: usize,
    pub copy_bytes_per_s: f64,
}

/// A backend runs on the executor's own thread; it is moved there once and never shared.
pub trait Backend: Send + 'static {
    fn info(&self) -> BackendInfo;

    /// Runs one step: applies its block copies between the KV tiers (`step.kv_copies`, in
    /// order; the first `kv_copies_for_forward` land before this step's forward, the rest
    /// before the next step's: `executor::kv_tier`), applies its diffs to the backend's persistent input batch
    /// (`executor::input_batch`), writes the batch's K/V into the paged pool through
    /// `slot_mapping`, computes logits at each sampling sequence's last position, and samples one
    /// token for each (appended to the backend's own copy of the request's tokens); a sequence
    /// with draft positions gets its proposer's drafts, logits at its last k + 1 positions and
    /// their verification (the accepted drafts, then one token of the target's). Steps must
    /// come in order, none skipped: each is a diff against the last. The step's drops are
    /// applied before anything can fail; after an error the scheduler aborts the step's
    /// requests (their ids come back to be dropped). A backend serves one scheduler for its
    /// life: finished requests are dropped with the scheduler's next step, so a second
    /// scheduler on the same backend would send ids it still holds.
    fn execute(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput>;

    /// Called once on the thread that will run every `execute` (the executor actor's), after
    /// the backend moved there: a backend may bind per-thread resources to it (the CPU backend
    /// makes it a worker of its thread pool, so a step needs no hand-over to the pool).
    fn on_executor_thread(&mut self) {}
}
