//! Plain HTTP handlers.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::edge::Edge;
use crate::engine::EngineHandle;
use crate::error::EngineError;
use crate::kv::actor::GetKvUsage;

/// An engine that cannot answer is `unavailable` (503, through `EngineError`'s `ResponseError`).
pub async fn health(engine: web::Data<EngineHandle>) -> Result<HttpResponse, EngineError> {
    let u = engine.kv.send(GetKvUsage).await.map_err(|e| {
        let err = EngineError::Unavailable(format!("KV manager: {e}"));
        engine.metrics.count_error(&err);
        err
    })?;
    Ok(HttpResponse::Ok().json(json!({
        "status": "ok",
        "model": engine.info.model_name,
        "device": engine.info.backend.device,
        "max_model_len": engine.info.max_model_len,
        "kv_blocks_used": u.used_blocks,
        "kv_blocks_total": u.total_blocks,
    })))
}

/// Behind the API key when one is set (`server.public_metrics` opens it); /health stays open
/// for load balancers (docs/PROTOCOL.md).
pub async fn metrics(
    req: HttpRequest,
    engine: web::Data<EngineHandle>,
    edge: web::Data<Edge>,
) -> HttpResponse {
    if let Err(e) = edge.access.check_metrics(&req) {
        return e.response();
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(engine.metrics.render())
}

/// Browsers ask for a favicon; answer without one rather than log a 404.
pub async fn no_content() -> HttpResponse {
    HttpResponse::NoContent().finish()
}

pub async fn not_found() -> HttpResponse {
    HttpResponse::NotFound()
        .json(json!({"error": "not_found", "message": "routes: GET /, /dashboard, /health, /metrics, /v1/ws, /v1/dashboard/stream, /v1/models; POST /v1/chat/completions, /v1/completions"}))
}
