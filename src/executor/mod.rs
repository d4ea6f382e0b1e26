//! Executors: the `Backend` trait, the flattened batch, and the backends behind it.
pub mod backend;
pub mod batch;
pub mod actor;
pub mod cuda;
