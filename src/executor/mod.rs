//! Executors: the `Backend` trait, the flattened batch, the executor actor and the backends.
pub mod actor;
pub mod backend;
pub mod batch;
pub mod cpu;
pub mod cuda;
