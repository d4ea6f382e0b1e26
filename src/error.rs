//! One error type for the boundaries. Each variant maps, here and nowhere else, to a WebSocket
//! error code ([`EngineError::code`]), an HTTP status ([`EngineError::http_status`], used by the
//! [`actix_web::ResponseError`] impl that HTTP handlers return) and a metric label
//! ([`EngineError::metric_label`], counted by `Metrics::count_error`, which every error passes
//! through on its way to a client). Where each variant is produced: docs/ARCHITECTURE.md.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;
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
    /// The engine cannot answer at all (an actor is gone); nothing the client did.
    #[error("engine unavailable: {0}")]
    Unavailable(String),
    #[error("too many messages on this connection; retry after {retry_after_ms} ms")]
    RateLimited { retry_after_ms: u64 },
    /// An HTTP API request without the server's API key (WebSocket upgrades are refused at
    /// the edge instead, `EdgeError`).
    #[error("{0}")]
    Unauthorized(String),
    #[error("the model `{0}` does not exist; GET /v1/models lists the served model")]
    ModelNotFound(String),
    /// An HTTP API body over `server.max_message_bytes`.
    #[error("the request body is over {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("internal error: {0}")]
    Internal(String),
    /// The server is draining (SIGTERM): it takes no new requests.
    #[error("the server is shutting down and takes no new requests; retry elsewhere or later")]
    ShuttingDown,
    /// The client did not read its socket: `unread_bytes` of output waited for it, over the
    /// limit (`server.max_unread_bytes`).
    #[error("slow consumer: {unread_bytes} bytes of output were not read from the socket (limit {limit}); its requests are cancelled")]
    SlowConsumer { unread_bytes: usize, limit: usize },
}

impl EngineError {
    /// Every variant, one example each (mapping tests, docs).
    #[cfg(test)]
    pub(crate) fn examples() -> Vec<EngineError> {
        vec![
            EngineError::InvalidJson("x".into()),
            EngineError::InvalidRequest("x".into()),
            EngineError::DuplicateId("x".into()),
            EngineError::UnknownId("x".into()),
            EngineError::PromptTooLong {
                prompt_tokens: 2,
                limit: 1,
            },
            EngineError::Overloaded {
                reason: "x".into(),
                retry_after_ms: 1500,
            },
            EngineError::Unavailable("x".into()),
            EngineError::Internal("x".into()),
            EngineError::Unauthorized("x".into()),
            EngineError::ModelNotFound("x".into()),
            EngineError::PayloadTooLarge { limit: 1 },
            EngineError::ShuttingDown,
            EngineError::SlowConsumer {
                unread_bytes: 2,
                limit: 1,
            },
        ]
    }

    /// The `code` field of a WS `error` frame (and of an HTTP error body).
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::InvalidJson(_) => "invalid_json",
            EngineError::InvalidRequest(_) => "invalid_request",
            EngineError::DuplicateId(_) => "duplicate_id",
            EngineError::UnknownId(_) => "unknown_id",
            EngineError::PromptTooLong { .. } => "prompt_too_long",
            EngineError::Overloaded { .. } => "overloaded",
            EngineError::Unavailable(_) => "unavailable",
            EngineError::RateLimited { .. } => "rate_limited",
            EngineError::Internal(_) => "internal",
            EngineError::Unauthorized(_) => "unauthorized",
            EngineError::ModelNotFound(_) => "model_not_found",
            EngineError::PayloadTooLarge { .. } => "payload_too_large",
            EngineError::ShuttingDown => "shutting_down",
            EngineError::SlowConsumer { .. } => "slow_consumer",
        }
    }

    /// The `type` of the OpenAI-style error body of the `/v1/completions` family
    /// (`{"error": {"message", "type", "param", "code"}}`, `code` being [`EngineError::code`]).
    pub fn openai_type(&self) -> &'static str {
        match self.http_status() {
            401 => "authentication_error",
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The `code` label of `brook:request_errors_total`: the WS code, so dashboards and clients
    /// speak of an error by one name.
    pub fn metric_label(&self) -> &'static str {
        self.code()
    }

    pub fn http_status(&self) -> u16 {
        match self {
            EngineError::InvalidJson(_)
            | EngineError::InvalidRequest(_)
            | EngineError::DuplicateId(_)
            | EngineError::UnknownId(_) => 400,
            EngineError::Unauthorized(_) => 401,
            EngineError::ModelNotFound(_) => 404,
            EngineError::PromptTooLong { .. } | EngineError::PayloadTooLarge { .. } => 413,
            // A client that does not read its stream is asked to slow down, as for a rate.
            EngineError::Overloaded { .. }
            | EngineError::RateLimited { .. }
            | EngineError::SlowConsumer { .. } => 429,
            EngineError::Internal(_) => 500,
            EngineError::Unavailable(_) | EngineError::ShuttingDown => 503,
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

/// HTTP handlers return `Result<_, EngineError>`; the status comes from `http_status`, the body
/// carries the same code and message as a WS error frame, and `overloaded` adds `Retry-After`.
/// Handlers count the error (`Metrics::count_error`) before returning it.
impl ResponseError for EngineError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.http_status()).expect("http_status returns valid codes")
    }

    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status_code());
        let mut body = json!({"code": self.code(), "message": self.to_string()});
        if let Some(ms) = self.retry_after_ms() {
            // The header counts whole seconds; the body keeps the precise hint.
            resp.insert_header((header::RETRY_AFTER, ms.div_ceil(1000).to_string()));
            body["retry_after_ms"] = json!(ms);
        }
        resp.json(json!({ "error": body }))
    }
}

pub type EngineResult<T> = Result<T, EngineError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_a_distinct_code_and_its_status() {
        let errors = EngineError::examples();
        let mut codes: Vec<&str> = errors.iter().map(EngineError::code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), errors.len(), "codes must be distinct");
        let status: Vec<(&str, u16)> = errors
            .iter()
            .map(|e| (e.metric_label(), e.http_status()))
            .collect();
        assert_eq!(
            status,
            [
                ("invalid_json", 400),
                ("invalid_request", 400),
                ("duplicate_id", 400),
                ("unknown_id", 400),
                ("prompt_too_long", 413),
                ("overloaded", 429),
                ("unavailable", 503),
                ("internal", 500),
                ("unauthorized", 401),
                ("model_not_found", 404),
                ("payload_too_large", 413),
                ("shutting_down", 503),
                ("slow_consumer", 429),
            ]
        );
        let types: Vec<&str> = errors.iter().map(EngineError::openai_type).collect();
        assert_eq!(
            types,
            [
                "invalid_request_error",
                "invalid_request_error",
                "invalid_request_error",
                "invalid_request_error",
                "invalid_request_error",
                "rate_limit_error",
                "service_unavailable_error",
                "server_error",
                "authentication_error",
                "invalid_request_error",
                "invalid_request_error",
                "service_unavailable_error",
                "rate_limit_error",
            ]
        );
    }

    #[actix_rt::test]
    async fn http_response_uses_the_status_code_and_retry_after() {
        for e in EngineError::examples() {
            let resp = e.error_response();
            assert_eq!(resp.status().as_u16(), e.http_status(), "{e}");
            let body = actix_web::body::to_bytes(resp.into_body()).await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], e.code());
            assert_eq!(v["error"]["message"], e.to_string());
        }
        let e = EngineError::Overloaded {
            reason: "queue full".into(),
            retry_after_ms: 1500,
        };
        let resp = e.error_response();
        assert_eq!(resp.headers().get(header::RETRY_AFTER).unwrap(), "2");
    }
}
