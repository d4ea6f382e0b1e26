//! The WebSocket edge's gate: the access policy, the connection count and the per-connection
//! limits, shared by all HTTP workers; and the refusals at upgrade, each mapped to its HTTP
//! status, JSON `error` code and metric label (`brook:websocket_rejected_total{reason}`) here.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::Access;
pub use super::edge_error::EdgeError;
use crate::config::ServerConfig;
use crate::engine::EngineHandle;
use crate::session::limits::{ConnectionSlots, EdgeLimits};

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
        if engine.health.is_draining() {
            return Err(EdgeError::ShuttingDown);
        }
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
