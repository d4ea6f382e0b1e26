//! One error type for the boundaries: each variant maps to a WebSocket error code, an HTTP status
//! and a metric label in one place (`code`, `http_status`).

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum EngineError {
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("a request with id {0:?} is already in flight on this connection")]
    DuplicateId(String),
    #[error("no request with id {0:?} is in flight on this connection")]
    UnknownId(String),
    #[error("prompt has {prompt_tokens} tokens; the limit is {limit}")]
    PromptTooLong { prompt_tokens: usize, limit: usize },
    #[error("server overloaded: {reason}; retry after {retry_after_ms} ms")]
    Overloaded { reason: String, retry_after_ms: u64 },
    #[error("too many messages on this connection; retry after {retry_after_ms} ms")]
    RateLimited { retry_after_ms: u64 },
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    /// The `code` field of a WS `error` frame; also the metric label.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::InvalidJson(_) => "invalid_json",
            EngineError::InvalidRequest(_) => "invalid_request",
            EngineError::DuplicateId(_) => "duplicate_id",
            EngineError::UnknownId(_) => "unknown_id",
            EngineError::PromptTooLong { .. } => "prompt_too_long",
            EngineError::Overloaded { .. } => "overloaded",
            EngineError::RateLimited { .. } => "rate_limited",
            EngineError::Internal(_) => "internal",
        }
    }

    pub fn http_status(&self) -> u16 {
        match self {
            EngineError::InvalidJson(_)
            | EngineError::InvalidRequest(_)
            | EngineError::DuplicateId(_)
            | EngineError::UnknownId(_) => 400,
            EngineError::PromptTooLong { .. } => 413,
            EngineError::Overloaded { .. } | EngineError::RateLimited { .. } => 429,
            EngineError::Internal(_) => 500,
        }
    }

    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            EngineError::Overloaded { retry_after_ms, .. }
            | EngineError::RateLimited { retry_after_ms } => Some(*retry_after_ms),
            _ => None,
        }
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        EngineError::InvalidRequest(msg.into())
    }
}

pub type EngineResult<T> = Result<T, EngineError>;
