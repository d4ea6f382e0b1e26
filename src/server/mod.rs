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

use actix_web::dev::HttpServiceFactory;
use actix_web::{web, App, FromRequest, Handler, HttpServer, Responder};
use anyhow::Context;

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
            .service(get_head("/", assets::page))
            .service(get_head("/dashboard", assets::page))
            .service(get_head("/static/{path:.*}", assets::asset))
            .service(only("/v1/dashboard/stream", "GET", dashboard::stream))
            .service(get_head("/favicon.ico", http::no_content))
            .service(get_head("/health", http::health))
            .service(get_head("/metrics", http::metrics))
            .service(only("/v1/ws", "GET", edge::ws_route))
            .service(only("/v1/chat/completions", "POST", openai::chat))
            .service(only("/v1/completions", "POST", openai::completions))
            .service(get_head("/v1/models", openai::models))
            .service(get_head("/v1/models/{model}", openai::model))
            .default_service(web::to(http::not_found));
    }
}

/// A route that takes GET, and HEAD through the same handler (actix sends no body for HEAD: a
/// load balancer's `HEAD /health`); any other method gets 405 with `Allow`.
fn get_head<F, Args>(path: &str, handler: F) -> impl HttpServiceFactory
where
    F: Handler<Args> + Clone,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler.clone()))
        .route(web::head().to(handler))
        .default_service(web::to(|| http::method_not_allowed("GET, HEAD")))
}

/// A route of one method (`method`: its name): the WebSocket upgrade and the event stream take
/// GET, the OpenAI API's completions POST; other methods get 405 with it as `Allow`.
fn only<F, Args>(path: &str, method: &'static str, handler: F) -> impl HttpServiceFactory
where
    F: Handler<Args>,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    let m = actix_web::http::Method::from_bytes(method.as_bytes()).expect("an HTTP method name");
    web::resource(path)
        .route(web::route().method(m).to(handler))
        .default_service(web::to(move || http::method_not_allowed(method)))
}

/// `host:port` as a URL's authority: an IPv6 address in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
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
    .bind((server.host.as_str(), server.port))
    .with_context(|| {
        format!(
            "listening on {} (--host / --port, server.host / server.port)",
            host_port(&server.host, server.port)
        )
    })?;
    let port = http
        .addrs()
        .first()
        .map(|a| a.port())
        .unwrap_or(server.port);
    Ok((http.run(), port))
}
