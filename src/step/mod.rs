//! The per-step data exchanged by the scheduler and the executor, and nothing else: a neutral
//! module that depends only on leaf data modules (`request`, `sampling::params`), so the
//! scheduler and the executor both depend on it and never on each other.
//!
//! One step:
//! ```text
//! Scheduler::schedule ──SchedulerOutput──▶ executor: InputBatch::update ─▶ BatchInput ─▶ forward
//!      ▲                 (diffs: new requests once,        (persistent rows: tokens so far,
//!      │                  then tokens scheduled, new        block tables; flat token_ids,
//!      │                  blocks; ids to drop)              positions, slot_mapping built once)
//!      └──── update_from_output ◀──StepOutput── sampling (the executor appends its own tokens)
//!                 └──▶ RequestUpdate per request (to the actor / output processing)
//! ```
//!
//! - [`SchedulerOutput`]: what one `schedule()` plans. A request's prompt, sampling parameters,
//!   seed and block ids go to the executor once ([`NewRequestData`], again after a preemption);
//!   afterwards each step carries per request only the tokens scheduled and the blocks appended
//!   ([`ScheduledRequest`]), plus the ids the executor must drop. Sliding-window models also
//!   carry how many leading blocks were freed behind the window: those table entries become
//!   [`NULL_BLOCK`] (the one diff that rewrites existing entries).
//! - [`BatchInput`]: the flattened batch a forward runs, built by the executor.
//! - [`StepOutput`]: the sampled tokens and the step's time.
//! - [`RequestUpdate`]: what `update_from_output` reports for a request.
//!
//! - Speculative decoding (`crate::spec`): a decode may reserve draft positions
//!   (`ScheduledRequest::num_draft_tokens`). The executor's proposer fills them, the target
//!   verifies them in the same forward, and the verified tokens come back as consecutive
//!   entries of `StepOutput::sampled` (with a `DraftOutcome` each); `RequestUpdate::new_token_ids`
//!   carries them on. Rejected drafts need no message for the tokens: the next step's
//!   `num_computed_tokens` (and `sample`) tell the executor where the request's known tokens
//!   end, and it trims what it appended beyond that. Blocks released after a rejection travel
//!   as `truncate_blocks_to`.
//!
//! Where later work goes, without another redesign:
//! - KV memory tier (landed): [`SchedulerOutput::kv_copies`], one ordered list of block copies
//!   between the device and host tiers and within the device (copy-on-write), applied by the
//!   executor before the forward, beside the drops ([`kv_copy`]).
pub mod batch;
pub mod kv_copy;
pub mod output;
pub mod scheduler_output;
pub mod update;

pub use batch::{BatchInput, BlockTables, SampleInput, SeqInput, NULL_BLOCK};
pub use kv_copy::{BlockCopy, CopyKind};
pub use output::{DraftOutcome, SampledToken, SpecOutput, StepOutput, TopLogprobs};
pub use scheduler_output::{NewRequestData, ScheduledRequest, SchedulerOutput};
pub use update::RequestUpdate;
