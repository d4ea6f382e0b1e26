//! Output processing, out of the scheduler actor (vLLM v1's OutputProcessor): what happens to a
//! step's sampled tokens between the scheduler core and the sessions.
//!
//! - [`detok`]: incremental detokenizer (never broken UTF-8, O(window) per step);
//! - [`stop`]: stop strings over streamed text (held back while they could still match);
//! - [`text`]: the two together for one request;
//! - [`processor`]: per-request state — event channel, pending text, usage and timing — and the
//!   [`StreamEvent`](crate::request::StreamEvent)s sent to sessions, with the channel rules: at
//!   most one delta per request per step; while a channel is full, text merges into the next
//!   delta (bounded memory, the engine never blocks); a closed channel cancels; terminal events
//!   always arrive;
//! - [`backlog`]: output a socket has not taken yet, bounded per socket (`slow_consumer`).
//!
//! Pure and synchronous: time comes in as explicit `Instant`s, events go out with `try_send`,
//! and whatever must reach the core (stop-string finishes, closed channels) or wait for room in
//! a channel is returned to the caller (the scheduler actor) as a [`Processed`].

pub mod backlog;
pub mod detok;
pub mod processor;
pub mod stop;
#[cfg(test)]
mod tests;
pub mod text;

pub use backlog::{delta_bytes, Backlog};
pub use processor::{BlockedTerminal, OutputProcessor, Processed};
