//! Request classes by prompt length: each class has its own lane and its own SLOs.

use serde::Serialize;

use crate::scheduler::ClassConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestClass {
    /// Short prompt: the fast lane, admitted first, never chunked.
    Short,
    /// The normal lane.
    Medium,
    /// Long prompt: streaming prefill under a bounded per-step budget.
    Long,
}

impl RequestClass {
    pub const ALL: [RequestClass; 3] = [
        RequestClass::Short,
        RequestClass::Medium,
        RequestClass::Long,
    ];

    pub fn classify(prompt_tokens: usize, cfg: &ClassConfig) -> RequestClass {
        if prompt_tokens < cfg.short_below {
            RequestClass::Short
        } else if prompt_tokens > cfg.long_above {
            RequestClass::Long
        } else {
            RequestClass::Medium
        }
    }

    /// Dense index for per-class arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RequestClass::Short => "short",
            RequestClass::Medium => "medium",
            RequestClass::Long => "long",
        }
    }
}
