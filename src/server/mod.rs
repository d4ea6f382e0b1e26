//! The HTTP side: `/` and `/dashboard` (the page), `/static/…`, `/health`, `/metrics`, the
//! dashboard's event stream, the `/v1/ws` upgrade, and the OpenAI-compatible API (`openai/`:
//! `/v1/chat/completions`, `/v1/completions`, `/v1/models`), behind the edge's gate (auth.rs:
//! API key and origins; edge.rs: connection count and refusals).
pub mod assets;
pub mod auth;
pub mod dashboard;
pub mod edge;
pub mod edge_error;
pub mod http;
pub mod openai;
pub mod shutdown;

use std::sync::Arc;

use actix_web::{web, App, HttpServer};

use crate::config::ServerConfig;
use crate::engine::EngineHandle;
use edge::Edge;

/// Builds the app's routes; shared by `brook serve` and the end-to-end tests.
pub fn configure(
    engine: Arc<EngineHandle>,
    edge: Arc<Edge>,
) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(web::Data::from(engine))
            .app_data(web::Data::from(edge))
            .route("/", web::get().to(assets::page))
            .route("/dashboard", web::get().to(assets::page))
            .route("/static/{path:.*}", web::get().to(assets::asset))
            .route("/v1/dashboard/stream", web::get().to(dashboard::stream))
            .route("/favicon.ico", web::get().to(http::no_content))
            .route("/health", web::get().to(http::health))
            .route("/metrics", web::get().to(http::metrics))
            .route("/v1/ws", web::get().to(edge::ws_route))
            .route("/v1/chat/completions", web::post().to(openai::chat))
            .route("/v1/completions", web::post().to(openai::completions))
            .route("/v1/models", web::get().to(openai::models))
            .route("/v1/models/{model}", web::get().to(openai::model))
            .default_service(web::to(http::not_found));
    }
}

/// Seconds the HTTP workers wait for open connections once the server stops (after a drain).
pub const STOP_GRACE_S: u64 = 2;

/// Binds `server.host:server.port` (port 0: any free one) and returns the running server and
/// its port; the caller awaits the server. Starts the dashboard's producer (one per server,
/// shared by the workers; the stream route needs it).
pub fn bind(
    engine: Arc<EngineHandle>,
    server: &ServerConfig,
) -> anyhow::Result<(actix_web::dev::Server, u16)> {
    // One Edge for all workers: the connection count is server-wide.
    let edge = Arc::new(Edge::from_config(server)?);
    let dash = web::Data::from(dashboard::Dashboard::start(&engine));
    let http = HttpServer::new(move || {
        App::new()
            .app_data(dash.clone())
            .configure(configure(engine.clone(), edge.clone()))
    })
    .workers(2)
    .on_connect(crate::session::socket::on_connect(
        server.socket_send_buffer_bytes,
    ))
    // SIGTERM and Ctrl-C drain the engine first (serve.rs), then stop the server; by then
    // sockets have closed themselves, so the workers' grace only covers stuck ones.
    .disable_signals()
    .shutdown_timeout(STOP_GRACE_S)
    .bind((server.host.as_str(), server.port))?;
    let port = http
        .addrs()
        .first()
        .map(|a| a.port())
        .unwrap_or(server.port);
    Ok((http.run(), port))
}
