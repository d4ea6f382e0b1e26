//! `brook serve`: resolve the model, start the engine and the HTTP server.

use std::path::PathBuf;

use clap::Args;

use crate::config::Config;
use crate::engine_args::EngineArgs;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[arg(long)]
    pub host: Option<String>,
    #[arg(long)]
    pub port: Option<u16>,
}

/// The model folder to serve: the flag or config, else the bundled demo model, else a small
/// random-weight model generated on the spot (said loudly: its replies are noise).
pub fn resolve_model(cfg: &Config) -> anyhow::Result<(PathBuf, Option<tempfile_dir::TempModel>)> {
    if let Some(p) = &cfg.model.path {
        return Ok((p.clone(), None));
    }
    if let Some(p) = crate::engine::default_model_dir() {
        return Ok((p, None));
    }
    let tmp = tempfile_dir::TempModel::generate()?;
    eprintln!(
        "WARNING: the bundled demo model (models/demo-chat) was not found; serving a generated \
         random-weight Llama from {} — its replies are random text",
        tmp.path().display()
    );
    Ok((tmp.path().to_path_buf(), Some(tmp)))
}

pub mod tempfile_dir {
    //! A generated random-weight model in a temporary folder, removed on drop.
    use std::path::{Path, PathBuf};

    pub struct TempModel(PathBuf);

    impl TempModel {
        pub fn generate() -> anyhow::Result<Self> {
            let dir =
                std::env::temp_dir().join(format!("brook-random-model-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            crate::model::testing::write_test_model(
                &dir,
                &crate::model::testing::TestModelSpec::default(),
            )?;
            Ok(TempModel(dir))
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempModel {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = args.engine.resolve()?;
    if let Some(h) = args.host {
        cfg.server.host = h;
    }
    if let Some(p) = args.port {
        cfg.server.port = p;
    }
    let (model_dir, _tmp) = resolve_model(&cfg)?;
    let system = actix::System::new();
    system.block_on(async move {
        let engine = crate::engine::start(&cfg, &model_dir, true)?;
        let (server, port) = crate::server::bind(engine.clone(), &cfg.server.host, cfg.server.port)?;
        eprintln!("{}", engine.info.summary());
        eprintln!("brook listening on http://{}:{port}  (chat page: /, WebSocket: /v1/ws, /health, /metrics)", cfg.server.host);
        server.await?;
        Ok::<(), anyhow::Error>(())
    })
}
