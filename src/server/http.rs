//! Plain HTTP handlers.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::edge::Edge;
use crate::engine::EngineHandle;
use crate::error::EngineError;
use crate::health::Status;
use crate::kv::actor::GetKvUsage;

/// 200 `"status":"ok"` while serving; 503 with `"status"` `draining` (SIGTERM), `stalled` (a
/// step past its deadline) or `failed` (no backend), and a `reason`, so load balancers stop
/// sending work. An engine that cannot answer is `unavailable` (503, through `EngineError`'s
/// `ResponseError`).
pub async fn health(engine: web::Data<EngineHandle>) -> Result<HttpResponse, EngineError> {
    let u = engine.kv.send(GetKvUsage).await.map_err(|e| {
        let err = EngineError::Unavailable(format!("KV manager: {e}"));
        engine.metrics.count_error(&err);
        err
    })?;
    let status = engine.health.status();
    let mut body = json!({
        "status": status.label(),
        "model": engine.info.model_name,
        "device": engine.info.backend.device,
        "max_model_len": engine.info.max_model_len,
        "kv_blocks_used": u.used_blocks,
        "kv_blocks_total": u.total_blocks,
    });
    if status.is_serving() {
        return Ok(HttpResponse::Ok().json(body));
    }
    body["reason"] = json!(match (status, engine.health.admission_error()) {
        (Status::Failed(why), _) => why,
        (_, Some(e)) => e.to_string(),
        (_, None) => String::new(),
    });
    Ok(HttpResponse::ServiceUnavailable().json(body))
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

/// A known route asked with a method it does not take: 405, `Allow: allow`.
pub async fn method_not_allowed(allow: &'static str) -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header((actix_web::http::header::ALLOW, allow))
        .json(
            json!({"error": "method_not_allowed", "message": format!("this route takes {allow}")}),
        )
}

pub async fn not_found() -> HttpResponse {
    HttpResponse::NotFound()
        .json(json!({"error": "not_found", "message": "routes: GET /, /dashboard, /health, /metrics, /v1/ws, /v1/dashboard/stream, /v1/models; POST /v1/chat/completions, /v1/completions"}))
}
