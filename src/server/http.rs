//! Plain HTTP handlers.

use actix_web::{http::header::ContentType, web, HttpRequest, HttpResponse};
use serde_json::json;

use super::edge::Edge;
use crate::engine::EngineHandle;
use crate::kv::actor::GetKvUsage;

/// The chat page is compiled in, so `brook serve` works from any directory.
const INDEX_HTML: &str = include_str!("../../static/index.html");

pub async fn index() -> HttpResponse {
    HttpResponse::Ok()
        .content_type(ContentType::html())
        .body(INDEX_HTML)
}

pub async fn health(engine: web::Data<EngineHandle>) -> HttpResponse {
    match engine.kv.send(GetKvUsage).await {
        Ok(u) => HttpResponse::Ok().json(json!({
            "status": "ok",
            "model": engine.info.model_name,
            "device": engine.info.backend.device,
            "max_model_len": engine.info.max_model_len,
            "kv_blocks_used": u.used_blocks,
            "kv_blocks_total": u.total_blocks,
        })),
        Err(e) => HttpResponse::ServiceUnavailable()
            .json(json!({"status": "unavailable", "message": e.to_string()})),
    }
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
        .json(json!({"error": "not_found", "message": "routes: GET /, /health, /metrics, /v1/ws"}))
}
