//! Admission control: what `Scheduler::add_request` answers.

use serde::Serialize;

use crate::error::EngineError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverloadReason {
    /// The waiting queue holds `admission.max_waiting_requests` requests.
    QueueRequests,
    /// The waiting prompts would exceed `admission.max_waiting_prompt_tokens`.
    QueueTokens,
    /// Its prefill, behind the prompts queued ahead of it in its lane, cannot finish within its
    /// TTFT SLO even with the whole step budget (adaptive, `admission.early_reject`).
    TtftUnreachable,
    /// Every sequence slot is taken, and the earliest a slot can free for it — the running
    /// requests that can only end at their length finishing first, the requests queued ahead of
    /// it taking the slots before it — is past its TTFT SLO (adaptive, `admission.early_reject`).
    SlotWait,
}

impl OverloadReason {
    pub const ALL: [OverloadReason; 4] = [
        OverloadReason::QueueRequests,
        OverloadReason::QueueTokens,
        OverloadReason::TtftUnreachable,
        OverloadReason::SlotWait,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OverloadReason::QueueRequests => "queue_requests",
            OverloadReason::QueueTokens => "queue_tokens",
            OverloadReason::TtftUnreachable => "ttft_unreachable",
            OverloadReason::SlotWait => "slot_wait",
        }
    }

    /// What the client reads in the error's message.
    pub fn describe(self) -> &'static str {
        match self {
            OverloadReason::QueueRequests => "the waiting queue is full",
            OverloadReason::QueueTokens => "the waiting prompts hold the most tokens allowed",
            OverloadReason::TtftUnreachable => {
                "its first token cannot come within its latency target behind the prompts queued ahead"
            }
            OverloadReason::SlotWait => {
                "no sequence slot frees in time for its latency target"
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Accepted,
    /// A request with this id is already known; nothing changed.
    Duplicate,
    /// Refused: the client should retry after `retry_after_ms`.
    Overloaded {
        reason: OverloadReason,
        retry_after_ms: u64,
    },
}

impl Admission {
    pub fn is_accepted(self) -> bool {
        self == Admission::Accepted
    }

    /// The one place a refusal becomes the client's error: `overloaded` (HTTP 429) when refused
    /// for load; `internal` for a reused id, which only an engine bug can cause.
    pub fn to_error(self) -> Option<EngineError> {
        match self {
            Admission::Accepted => None,
            Admission::Overloaded {
                reason,
                retry_after_ms,
            } => Some(EngineError::Overloaded {
                reason: reason.describe().into(),
                retry_after_ms,
            }),
            Admission::Duplicate => Some(EngineError::Internal("request id reused".into())),
        }
    }
}
