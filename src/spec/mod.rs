//! Speculative decoding: a cheap proposer guesses the next k tokens of a request, the target
//! model computes them together with the last known token (k + 1 positions, inside the normal
//! varlen batch), and exact verification (`sampling::rejection`) keeps the longest prefix it
//! agrees with plus one token of its own — so a step yields 1 to k + 1 tokens whose
//! distribution is exactly the target's.
//!
//! Where the parts live:
//! - this module: the configuration ([`config`]), the [`proposer::Proposer`] seam, the
//!   n-gram prompt-lookup proposer ([`ngram`]), the draft-model proposer over any device's
//!   forward ([`draft`]), the draft/target compatibility check ([`compat`]); nothing here
//!   depends on the scheduler or the executor.
//! - the scheduler chooses each request's depth k every step (`scheduler::spec`: acceptance
//!   EMA, KV pressure, emergency mode, a cost model of verification against drafting), reserves
//!   k draft positions in the request's block table (`ScheduledRequest::num_draft_tokens`),
//!   and after the step keeps the verified tokens only, releasing the blocks that held only
//!   rejected positions (KV rollback; unverified tokens are never hashed into the prefix cache).
//! - the executor proposes (n-gram here, or the draft model: `executor::cpu::draft`,
//!   `executor::cuda::draft`), runs the target over the k + 1 positions and verifies.
pub mod compat;
pub mod config;
pub mod draft;
pub mod ngram;
pub mod proposer;

pub use config::{SpecConfig, SpecMethod};
pub use proposer::{Proposal, ProposeRequest, Proposer};
