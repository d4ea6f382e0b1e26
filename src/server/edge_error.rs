//! The refusals at the WebSocket edge's gate, each mapped to its HTTP status, JSON `error` code
//! and metric label (`brook:websocket_rejected_total{reason}`) here.

use actix_web::http::header;
use actix_web::HttpResponse;
use serde_json::json;

#[derive(Debug, Clone, PartialEq)]
pub enum EdgeError {
    MissingKey,
    WrongKey,
    OriginNotAllowed(String),
    TooManyConnections {
        limit: usize,
    },
    /// The server is draining (SIGTERM): no new sockets.
    ShuttingDown,
}

impl EdgeError {
    pub fn http_status(&self) -> u16 {
        match self {
            EdgeError::MissingKey | EdgeError::WrongKey => 401,
            EdgeError::OriginNotAllowed(_) => 403,
            EdgeError::TooManyConnections { .. } | EdgeError::ShuttingDown => 503,
        }
    }

    /// The JSON body's `error` field.
    pub fn code(&self) -> &'static str {
        match self {
            EdgeError::MissingKey | EdgeError::WrongKey => "unauthorized",
            EdgeError::OriginNotAllowed(_) => "origin_not_allowed",
            EdgeError::TooManyConnections { .. } => "too_many_connections",
            EdgeError::ShuttingDown => "shutting_down",
        }
    }

    /// The metric label (finer than `code`: a missing key and a wrong one are told apart).
    pub fn label(&self) -> &'static str {
        match self {
            EdgeError::MissingKey => "missing_api_key",
            EdgeError::WrongKey => "wrong_api_key",
            EdgeError::OriginNotAllowed(_) => "origin_not_allowed",
            EdgeError::TooManyConnections { .. } => "too_many_connections",
            EdgeError::ShuttingDown => "shutting_down",
        }
    }

    pub fn message(&self) -> String {
        match self {
            EdgeError::MissingKey => "an API key is required: send `Authorization: Bearer <key>` \
                 (WebSocket from a browser: subprotocols `brook, bearer.<key>`, or `?api_key=<key>`)"
                .into(),
            EdgeError::WrongKey => "the API key is not valid".into(),
            EdgeError::OriginNotAllowed(o) => {
                format!("origin {o:?} may not open a WebSocket here (server.allowed_origins)")
            }
            EdgeError::TooManyConnections { limit } => {
                format!("{limit} WebSocket connections are open, the server's limit; retry later")
            }
            EdgeError::ShuttingDown => crate::error::EngineError::ShuttingDown.to_string(),
        }
    }

    pub fn response(&self) -> HttpResponse {
        let status = actix_web::http::StatusCode::from_u16(self.http_status())
            .expect("edge statuses are valid");
        let mut resp = HttpResponse::build(status);
        match self {
            EdgeError::MissingKey | EdgeError::WrongKey => {
                resp.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            EdgeError::TooManyConnections { .. } => {
                resp.insert_header((header::RETRY_AFTER, "1"));
            }
            EdgeError::OriginNotAllowed(_) | EdgeError::ShuttingDown => {}
        }
        resp.json(json!({"error": self.code(), "message": self.message()}))
    }
}
