//! The per-step data exchanged by the scheduler and the executor: what one `schedule()` plans
//! ([`SchedulerOutput`]), the flattened batch a backend's forward runs ([`BatchInput`]), what the
//! executor returns ([`StepOutput`]) and what `update_from_output()` reports per request
//! ([`RequestUpdate`]).
//!
//! A neutral module: it depends only on leaf data modules (`request`, `sampling::params`), so
//! the scheduler and the executor both depend on it and never on each other.
pub mod batch;
pub mod output;
pub mod scheduler_output;
pub mod update;

pub use batch::{BatchInput, SampleInput, SeqInput};
pub use output::{SampledToken, StepOutput};
pub use scheduler_output::SchedulerOutput;
pub use update::RequestUpdate;
