//! Scheduling: the pure core (one token budget per step) and the actor that drives it.
pub mod actor;
