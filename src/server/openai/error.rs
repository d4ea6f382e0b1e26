//! The OpenAI error body, `{"error": {"message", "type", "param", "code"}}`: status, `type` and
//! `code` come from `EngineError` (error.rs maps each variant once); `param` names the request
//! field at fault when one is.

use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;
use serde_json::{json, Value};

use crate::error::EngineError;
use crate::server::edge::EdgeError;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub error: EngineError,
    pub param: Option<String>,
}

impl ApiError {
    /// A bad value of request field `param`.
    pub fn invalid(param: &str, msg: impl Into<String>) -> Self {
        ApiError {
            error: EngineError::invalid(msg),
            param: Some(param.to_owned()),
        }
    }

    /// A field this server does not implement: refused, never ignored.
    pub fn unsupported(param: &str) -> Self {
        ApiError::invalid(
            param,
            format!("`{param}` is not supported by this server (docs/OPENAI.md lists what is)"),
        )
    }

    /// A refused API key (the edge's check).
    pub fn from_edge(e: EdgeError) -> Self {
        ApiError {
            error: EngineError::Unauthorized(e.message()),
            param: None,
        }
    }

    /// The body as JSON (also the `data:` of an error inside a stream); an `overloaded` one
    /// also carries `retry_after_ms`, as the WebSocket's error frame does.
    pub fn body(&self) -> Value {
        let e = &self.error;
        let mut body = json!({
            "message": e.to_string(),
            "type": e.openai_type(),
            "param": self.param,
            "code": e.code(),
        });
        if let Some(ms) = e.retry_after_ms() {
            body["retry_after_ms"] = ms.into();
        }
        json!({ "error": body })
    }

    pub fn response(&self) -> HttpResponse {
        let status = StatusCode::from_u16(self.error.http_status()).expect("valid statuses");
        let mut resp = HttpResponse::build(status);
        if let Some(ms) = self.error.retry_after_ms() {
            resp.insert_header((header::RETRY_AFTER, ms.div_ceil(1000).to_string()));
        }
        if matches!(self.error, EngineError::Unauthorized(_)) {
            resp.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        resp.json(self.body())
    }
}

/// Validation names a parameter as `params.<field>` at the start of its message (the WS
/// protocol's object); the OpenAI API has no `params` object, so the prefix becomes `param`.
/// A top-level field is named as "field `<name>`" and kept in the message.
impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        if let EngineError::InvalidRequest(msg) = &error {
            if let Some((field, _)) = msg
                .strip_prefix("field `")
                .and_then(|rest| rest.split_once('`'))
            {
                return ApiError {
                    param: Some(field.to_owned()),
                    error,
                };
            }
            if let Some(rest) = msg.strip_prefix("params.") {
                let field: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                return ApiError {
                    param: Some(field),
                    error: EngineError::invalid(rest),
                };
            }
        }
        ApiError { error, param: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_top_level_field_in_the_message_is_the_param() {
        let e = ApiError::from(EngineError::invalid("field `n` must be 1 to 1, got 2"));
        assert_eq!(e.param.as_deref(), Some("n"));
        assert_eq!(
            e.body()["error"]["message"],
            "field `n` must be 1 to 1, got 2"
        );
    }

    #[actix_rt::test]
    async fn bodies_statuses_and_headers() {
        let e = ApiError::from(EngineError::invalid(
            "params.top_p must be in (0, 1], got 2",
        ));
        assert_eq!(e.param.as_deref(), Some("top_p"));
        assert_eq!(
            e.body(),
            json!({"error": {"message": "top_p must be in (0, 1], got 2",
                             "type": "invalid_request_error", "param": "top_p",
                             "code": "invalid_request"}})
        );
        let e = ApiError::from(EngineError::Overloaded {
            reason: "queue full".into(),
            retry_after_ms: 1200,
        });
        let resp = e.response();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers().get(header::RETRY_AFTER).unwrap(), "2");
        assert_eq!(e.body()["error"]["retry_after_ms"], 1200);
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        let resp = ApiError::from_edge(EdgeError::MissingKey).response();
        assert_eq!(resp.status(), 401);
        assert!(resp.headers().contains_key(header::WWW_AUTHENTICATE));
        let e = ApiError::unsupported("tools");
        assert_eq!(
            (e.param.as_deref(), e.error.code()),
            (Some("tools"), "invalid_request")
        );
    }
}
