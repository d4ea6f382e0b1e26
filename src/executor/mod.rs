//! Executors: the `Backend` trait, the executor actor and the backends.
pub mod actor;
pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod host_memory;
pub mod input_batch;
pub mod kv_tier;
pub mod null;
pub mod rank_threads;
/// The serving-path test harness (test-only; tests/cuda_e2e.rs includes it too).
#[cfg(test)]
pub mod testing;
pub mod verify;
