//! Paged KV-cache bookkeeping: the block pool, the per-request manager and its actor.
pub mod actor;
