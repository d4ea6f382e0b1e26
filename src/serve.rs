//! `brook serve`: resolve the model, start the engine and the HTTP server.

use std::path::PathBuf;

use crate::cli::ServeArgs;
use crate::config::Config;

/// The model folder to serve: the flag or config, else the bundled demo model.
pub fn resolve_model(cfg: &Config) -> anyhow::Result<PathBuf> {
    if let Some(p) = &cfg.model.path {
        return Ok(p.clone());
    }
    crate::engine::default_model_dir().ok_or_else(|| {
        anyhow::anyhow!(
            "no model: the bundled demo model (models/demo-chat) was not found; \
             pass --model DIR (a Hugging Face model folder)"
        )
    })
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = args.engine.resolve()?;
    if let Some(h) = args.host {
        cfg.server.host = h;
    }
    if let Some(p) = args.port {
        cfg.server.port = p;
    }
    let model_dir = resolve_model(&cfg)?;
    let system = actix::System::new();
    system.block_on(async move {
        let engine = crate::engine::start(&cfg, &model_dir, true)?;
        let (server, port) = crate::server::bind(engine.clone(), &cfg.server.host, cfg.server.port)?;
        eprintln!("{}", engine.info.summary());
        eprintln!("brook listening on http://{}:{port}  (chat page: /, dashboard: /dashboard, WebSocket: /v1/ws, /health, /metrics)", cfg.server.host);
        server.await?;
        Ok::<(), anyhow::Error>(())
    })
}
