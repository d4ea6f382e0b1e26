//! The HTTP side: `/` and `/dashboard` (the page), `/static/…`, `/health`, `/metrics`, the
//! dashboard's event stream and the `/v1/ws` upgrade.
pub mod assets;
pub mod dashboard;
pub mod http;

use std::sync::Arc;

use actix_web::{web, App, HttpServer};

use crate::engine::EngineHandle;

/// Builds the app's routes; shared by `brook serve` and the end-to-end tests.
pub fn configure(engine: Arc<EngineHandle>) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(web::Data::from(engine))
            .route("/", web::get().to(assets::page))
            .route("/dashboard", web::get().to(assets::page))
            .route("/static/{path:.*}", web::get().to(assets::asset))
            .route("/v1/dashboard/stream", web::get().to(dashboard::stream))
            .route("/favicon.ico", web::get().to(http::no_content))
            .route("/health", web::get().to(http::health))
            .route("/metrics", web::get().to(http::metrics))
            .route("/v1/ws", web::get().to(crate::session::ws_route))
            .default_service(web::to(http::not_found));
    }
}

/// Binds and returns the running server; the caller awaits it. Starts the dashboard's
/// producer (one per server, shared by the workers; the stream route needs it).
pub fn bind(
    engine: Arc<EngineHandle>,
    host: &str,
    port: u16,
) -> std::io::Result<(actix_web::dev::Server, u16)> {
    let dash = web::Data::from(dashboard::Dashboard::start(&engine));
    let server = HttpServer::new(move || {
        App::new()
            .app_data(dash.clone())
            .configure(configure(engine.clone()))
    })
    .workers(2)
    .bind((host, port))?;
    let port = server.addrs().first().map(|a| a.port()).unwrap_or(port);
    Ok((server.run(), port))
}
