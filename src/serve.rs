//! `brook serve`: resolve the model, start the engine and the HTTP server.

use std::path::PathBuf;

use clap::builder::PossibleValuesParser;
use clap::Args;

use crate::config::Config;
use crate::engine_args::EngineArgs;
use crate::model::synthetic::SYNTHETIC_MODELS;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[arg(long)]
    pub host: Option<String>,
    #[arg(long)]
    pub port: Option<u16>,
    /// API key clients must present: `Authorization: Bearer <key>`, or for a browser's
    /// WebSocket the subprotocol `bearer.<key>` (next to `brook`) or `?api_key=<key>`. Prefer
    /// the environment variable: a flag shows in the process list.
    #[arg(long, env = "BROOK_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Origins allowed to open a WebSocket, comma separated (`https://chat.example.com`);
    /// clients without an Origin header always pass; list the server's own origin to use its
    /// chat page. Default: any.
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Option<Vec<String>>,
    /// Open WebSocket connections at most (beyond it an upgrade gets HTTP 503).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Serve /metrics and the dashboard stream without the API key.
    #[arg(long)]
    pub public_metrics: bool,
    /// On SIGTERM or Ctrl-C, seconds the requests in flight get to finish before they end with
    /// `shutting_down` (new ones get it at once); then the server exits 0.
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_timeout: Option<f64>,
    /// Serve random weights of a known model's shapes instead of a model folder (generated on
    /// the GPU; on the CPU only `tiny`), with the tokenizer of --tokenizer: the whole server on a
    /// real shape without its checkpoint. The text is gibberish; send `ignore_eos` for full
    /// lengths.
    #[arg(long, value_name = "NAME", conflicts_with = "model",
          value_parser = PossibleValuesParser::new(SYNTHETIC_MODELS))]
    pub synthetic: Option<String>,
    /// With --synthetic: the model folder whose tokenizer and chat template to use (default: the
    /// bundled demo model, models/demo-chat). Only the tokenizer's ids are sampled.
    #[arg(long, value_name = "DIR", requires = "synthetic")]
    pub tokenizer: Option<PathBuf>,
    /// With --synthetic: seed of the random weights (default 0).
    #[arg(long, requires = "synthetic")]
    pub seed: Option<u64>,
}

/// What `serve` loads: a model folder, or a synthetic shape with a tokenizer folder.
enum Source {
    Folder(PathBuf),
    Synthetic {
        name: String,
        seed: u64,
        tokenizer: PathBuf,
    },
}

/// The model folder to serve: the flag or config, else the bundled demo model.
pub fn resolve_model(cfg: &Config) -> anyhow::Result<PathBuf> {
    if let Some(p) = &cfg.model.path {
        anyhow::ensure!(
            !p.is_file(),
            "--model {} is a file: give the model's folder (the one holding config.json)",
            p.display()
        );
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
    if let Some(key) = &args.api_key {
        let key = crate::access::ApiKey::new(key)
            .map_err(|e| anyhow::anyhow!("--api-key / BROOK_API_KEY: {e}"))?;
        cfg.server.api_key = Some(key);
    }
    if let Some(origins) = args.allowed_origins {
        cfg.server.allowed_origins = origins;
    }
    if let Some(n) = args.max_connections {
        cfg.server.max_connections = n;
    }
    cfg.server.public_metrics |= args.public_metrics;
    if let Some(t) = args.shutdown_timeout {
        cfg.server.shutdown_timeout_s = t;
    }
    cfg.validate()?;
    let source = match args.synthetic {
        Some(name) => {
            let tokenizer = match args.tokenizer {
                Some(dir) => dir,
                None => crate::engine::default_model_dir().ok_or_else(|| {
                    anyhow::anyhow!(
                        "--synthetic needs a tokenizer: the bundled demo model (models/demo-chat) \
                         was not found; pass --tokenizer DIR (a Hugging Face model folder)"
                    )
                })?,
            };
            Source::Synthetic {
                name,
                seed: args.seed.unwrap_or(0),
                tokenizer,
            }
        }
        None => Source::Folder(resolve_model(&cfg)?),
    };
    let system = actix::System::new();
    system.block_on(async move {
        let engine = match &source {
            Source::Folder(dir) => crate::engine::start(&cfg, dir, true)?,
            Source::Synthetic {
                name,
                seed,
                tokenizer,
            } => crate::engine::start_synthetic_with_tokenizer(&cfg, name, *seed, tokenizer)?,
        };
        let (server, port) = crate::server::bind(engine.clone(), &cfg.server)?;
        eprintln!("{}", engine.info.summary());
        if cfg.server.api_key.is_some() {
            eprintln!("API key required on /v1/ws, /v1/dashboard/stream{}", if cfg.server.public_metrics { "" } else { " and /metrics" });
        }
        eprintln!("brook listening on http://{}  (chat page: /, dashboard: /dashboard, WebSocket: /v1/ws, OpenAI API: /v1/chat/completions /v1/completions /v1/models, /health, /metrics)", crate::server::host_port(&cfg.server.host, port));
        let timeout = std::time::Duration::from_secs_f64(cfg.server.shutdown_timeout_s);
        let served = crate::server::shutdown::serve_until_signalled(engine.clone(), server, timeout).await;
        engine.shutdown().await;
        served
    })
}
