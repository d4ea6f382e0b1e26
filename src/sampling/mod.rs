//! Per-request sampling: validated parameters and the sampler.
pub mod params;
pub mod rejection;
pub mod sampler;
