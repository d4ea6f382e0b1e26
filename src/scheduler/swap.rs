//! Preemption with a host KV tier: swap the victim's blocks out, or drop them and recompute,
//! whichever costs less (`Scheduler::preempt`, in `core/tiers.rs`).

use serde::Deserialize;

/// How a preempted request gives up its device blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PreemptionMode {
    /// Per request, each time: the copies' time at the measured bandwidth against the cost
    /// model's time to recompute what it had computed.
    #[default]
    Auto,
    /// Always swap when the host tier has room (tests, benchmarks).
    Swap,
    /// Never swap.
    Recompute,
}

impl PreemptionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptionMode::Auto => "auto",
            PreemptionMode::Swap => "swap",
            PreemptionMode::Recompute => "recompute",
        }
    }
}

/// What one preemption did; a metric label (`brook:kv_preemption_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreemptDecision {
    /// Its blocks went to the host tier; it resumes where it stopped.
    Swap,
    /// Recomputing was cheaper (or swapping is off).
    Recompute,
    /// Swapping was wanted, but the host tier had too few free blocks.
    RecomputeHostFull,
    /// There is no host tier.
    RecomputeNoHost,
}

impl PreemptDecision {
    pub const ALL: [PreemptDecision; 4] = [
        PreemptDecision::Swap,
        PreemptDecision::Recompute,
        PreemptDecision::RecomputeHostFull,
        PreemptDecision::RecomputeNoHost,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PreemptDecision::Swap => "swap",
            PreemptDecision::Recompute => "recompute",
            PreemptDecision::RecomputeHostFull => "recompute_host_full",
            PreemptDecision::RecomputeNoHost => "recompute_no_host_tier",
        }
    }
}

/// What a block copy between the tiers costs: measured by the backend at start (CUDA: pinned
/// copies on its copy stream; CPU: memcpy), or configured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwapCost {
    /// One block across all layers, K and V.
    pub bytes_per_block: usize,
    /// Copy bandwidth, bytes per second, one direction.
    pub bytes_per_s: f64,
}

impl SwapCost {
    /// Milliseconds to copy `blocks` blocks.
    pub fn copy_ms(&self, blocks: usize) -> f64 {
        if self.bytes_per_s <= 0.0 {
            return f64::INFINITY;
        }
        (blocks * self.bytes_per_block) as f64 / self.bytes_per_s * 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_time_scales_with_blocks_and_bandwidth() {
        let c = SwapCost {
            bytes_per_block: 1 << 20,
            bytes_per_s: (1u64 << 30) as f64,
        };
        assert!((c.copy_ms(1024) - 1000.0).abs() < 1e-9);
        assert_eq!(c.copy_ms(0), 0.0);
        let none = SwapCost {
            bytes_per_s: 0.0,
            ..c
        };
        assert_eq!(none.copy_ms(1), f64::INFINITY);
        assert_eq!(PreemptDecision::ALL[2].as_str(), "recompute_host_full");
    }
}
