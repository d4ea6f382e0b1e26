//! Executors: the `Backend` trait, the executor actor and the backends.
pub mod actor;
pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod input_batch;
pub mod kv_tier;
pub mod verify;
