//! The OpenAI-compatible HTTP API beside the WebSocket API (docs/OPENAI.md):
//! `POST /v1/chat/completions`, `POST /v1/completions` (streaming as Server-Sent Events, or
//! whole), `GET /v1/models`. Both share the WebSocket API's admission path and engine: a body
//! is parsed into neutral `GenerateRequest`s (`request`), each passes `EngineCore::validate`,
//! its request goes to the engine with its `n` (`choices`: the engine forks the choices off
//! one prefill, shared prompt blocks), and once the scheduler admitted every prompt
//! (an `overloaded` refusal is a 429 with `Retry-After`, sent before any byte of a stream) the
//! events become chunks or a body (`stream`, `response`). Errors have OpenAI's shape
//! (`error`). A client that goes away drops the response, which aborts its requests.

mod choices;
mod error;
mod request;
mod response;
mod stream;

use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use serde_json::json;

use super::edge::Edge;
use crate::engine::EngineHandle;
use crate::error::EngineError;
pub use error::ApiError;
use request::Endpoint;
use response::Meta;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    req: HttpRequest,
    body: web::Payload,
    engine: web::Data<EngineHandle>,
    edge: web::Data<Edge>,
) -> HttpResponse {
    serve(Endpoint::Chat, req, body, engine, edge).await
}

/// `POST /v1/completions`.
pub async fn completions(
    req: HttpRequest,
    body: web::Payload,
    engine: web::Data<EngineHandle>,
    edge: web::Data<Edge>,
) -> HttpResponse {
    serve(Endpoint::Completion, req, body, engine, edge).await
}

/// `GET /v1/models`: the one served model.
pub async fn models(
    req: HttpRequest,
    engine: web::Data<EngineHandle>,
    edge: web::Data<Edge>,
) -> HttpResponse {
    match edge.access.check_http_api(&req) {
        Ok(()) => HttpResponse::Ok().json(json!({"object": "list", "data": [model_card(&engine)]})),
        Err(e) => refuse(&engine, ApiError::from_edge(e)),
    }
}

/// `GET /v1/models/{model}`.
pub async fn model(
    req: HttpRequest,
    path: web::Path<String>,
    engine: web::Data<EngineHandle>,
    edge: web::Data<Edge>,
) -> HttpResponse {
    if let Err(e) = edge.access.check_http_api(&req) {
        return refuse(&engine, ApiError::from_edge(e));
    }
    match path.as_str() == engine.info.model_name {
        true => HttpResponse::Ok().json(model_card(&engine)),
        false => refuse(
            &engine,
            ApiError {
                error: EngineError::ModelNotFound(path.into_inner()),
                param: Some("model".into()),
            },
        ),
    }
}

fn model_card(engine: &EngineHandle) -> serde_json::Value {
    json!({
        "id": engine.info.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "brook",
        "max_model_len": engine.info.max_model_len,
    })
}

/// Counts the error (every error on its way to a client is counted once) and answers it.
fn refuse(engine: &EngineHandle, e: ApiError) -> HttpResponse {
    engine.metrics.count_error(&e.error);
    e.response()
}

async fn serve(
    endpoint: Endpoint,
    req: HttpRequest,
    body: web::Payload,
    engine: web::Data<EngineHandle>,
    edge: web::Data<Edge>,
) -> HttpResponse {
    match try_serve(endpoint, req, body, &engine, &edge).await {
        Ok(resp) => resp,
        Err(e) => refuse(&engine, e),
    }
}

async fn try_serve(
    endpoint: Endpoint,
    req: HttpRequest,
    body: web::Payload,
    engine: &web::Data<EngineHandle>,
    edge: &Edge,
) -> Result<HttpResponse, ApiError> {
    edge.access
        .check_http_api(&req)
        .map_err(ApiError::from_edge)?;
    let bytes = read_body(body, edge.limits.max_message_bytes).await?;
    let parsed = request::parse(endpoint, &bytes)?;
    if parsed.model != engine.info.model_name {
        return Err(ApiError {
            error: EngineError::ModelNotFound(parsed.model),
            param: Some("model".into()),
        });
    }
    // Every prompt is checked before any is submitted.
    let valid = (parsed.requests.into_iter())
        .map(|r| engine.validate(r))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(user) = &parsed.user {
        tracing::debug!(user, "OpenAI API request");
    }
    let mut choices = choices::Choices::submit(engine.clone().into_inner(), &valid);
    let prompt_tokens = choices.admitted().await?;
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let meta = Meta {
        endpoint,
        id: format!("{prefix}-{:016x}", rand::random::<u64>()),
        created: unix_now(),
        model: engine.info.model_name.clone(),
        logprobs: parsed.logprobs,
        include_usage: parsed.include_usage,
    };
    if parsed.stream {
        Ok(stream::sse(
            meta,
            engine.clone().into_inner(),
            choices,
            prompt_tokens,
        ))
    } else {
        stream::complete(meta, engine, choices, prompt_tokens).await
    }
}

/// The request body, at most `limit` bytes (413 beyond, as the WebSocket API's message limit).
async fn read_body(mut body: web::Payload, limit: usize) -> Result<web::Bytes, ApiError> {
    let mut buf = web::BytesMut::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError {
            error: EngineError::invalid(format!("reading the request body: {e}")),
            param: None,
        })?;
        if buf.len() + chunk.len() > limit {
            return Err(ApiError {
                error: EngineError::PayloadTooLarge { limit },
                param: None,
            });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}
