//! Plain HTTP handlers.

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::engine::EngineHandle;
use crate::kv::actor::GetKvUsage;

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

pub async fn metrics(engine: web::Data<EngineHandle>) -> HttpResponse {
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
        .json(json!({"error": "not_found", "message": "routes: GET /, /dashboard, /health, /metrics, /v1/ws, /v1/dashboard/stream"}))
}
