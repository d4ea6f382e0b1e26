//! The WebSocket edge's gate: the access policy, the connection count and the per-connection
//! limits, shared by all HTTP workers; and the refusals at upgrade, each mapped to its HTTP
//! status, JSON `error` code and metric label (`brook:websocket_rejected_total{reason}`) here.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::auth::Access;
use crate::config::ServerConfig;
use crate::engine::EngineHandle;
use crate::session::limits::{ConnectionSlots, EdgeLimits};

#[derive(Debug, Clone, PartialEq)]
pub enum EdgeError {
    MissingKey,
    WrongKey,
    OriginNotAllowed(String),
    TooManyConnections { limit: usize },
}

impl EdgeError {
    pub fn http_status(&self) -> u16 {
        match self {
            EdgeError::MissingKey | EdgeError::WrongKey => 401,
            EdgeError::OriginNotAllowed(_) => 403,
            EdgeError::TooManyConnections { .. } => 503,
        }
    }

    /// The JSON body's `error` field.
    pub fn code(&self) -> &'static str {
        match self {
            EdgeError::MissingKey | EdgeError::WrongKey => "unauthorized",
            EdgeError::OriginNotAllowed(_) => "origin_not_allowed",
            EdgeError::TooManyConnections { .. } => "too_many_connections",
        }
    }

    /// The metric label (finer than `code`: a missing key and a wrong one are told apart).
    pub fn label(&self) -> &'static str {
        match self {
            EdgeError::MissingKey => "missing_api_key",
            EdgeError::WrongKey => "wrong_api_key",
            EdgeError::OriginNotAllowed(_) => "origin_not_allowed",
            EdgeError::TooManyConnections { .. } => "too_many_connections",
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
            EdgeError::OriginNotAllowed(_) => {}
        }
        resp.json(json!({"error": self.code(), "message": self.message()}))
    }
}

/// Shared by every worker: one per server.
pub struct Edge {
    pub access: Access,
    pub limits: Arc<EdgeLimits>,
    pub slots: Arc<ConnectionSlots>,
}

impl Edge {
    pub fn from_config(c: &ServerConfig) -> anyhow::Result<Self> {
        Ok(Edge {
            access: Access::from_config(c).map_err(|e| anyhow::anyhow!("server: {e}"))?,
            limits: Arc::new(EdgeLimits::from_config(c)),
            slots: ConnectionSlots::new(c.max_connections),
        })
    }
}

/// `GET /v1/ws`: origin, key and connection count are checked before the upgrade; then a
/// `Session` serves the socket.
pub async fn ws_route(
    req: HttpRequest,
    payload: web::Payload,
    engine: web::Data<EngineHandle>,
    edge: web::Data<Edge>,
) -> actix_web::Result<HttpResponse> {
    let gate = edge.access.check_ws(&req).and_then(|()| {
        edge.slots
            .try_acquire()
            .ok_or(EdgeError::TooManyConnections {
                limit: edge.slots.max(),
            })
    });
    match gate {
        Ok(slot) => crate::session::start(
            &req,
            payload,
            engine.into_inner(),
            edge.limits.clone(),
            slot,
        ),
        Err(e) => {
            engine
                .metrics
                .ws_rejected
                .with_label_values(&[e.label()])
                .inc();
            Ok(e.response())
        }
    }
}
