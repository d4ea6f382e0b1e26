//! Graceful shutdown on SIGTERM or Ctrl-C (actix's own signal handling is off, see `bind`):
//! 1. drain: the engine's health turns `draining` — new WebSocket upgrades get HTTP 503
//!    `shutting_down`, new requests on open sockets get the error `shutting_down`, /health
//!    answers 503 `"status":"draining"`;
//! 2. the requests accepted before get `server.shutdown_timeout_s` to finish (the scheduler
//!    says when none is left; nothing polls); those left then end with `shutting_down`, their KV
//!    freed; a second signal skips the wait;
//! 3. sockets close themselves (1001) once their last request has ended; the HTTP server stops,
//!    giving connections still open `STOP_GRACE_S`; the process exits 0.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::engine::EngineHandle;
use crate::error::EngineError;
use crate::scheduler::actor::{FailAll, WhenIdle};

/// Runs `server` until it ends by itself (an error) or a signal came and the drain above is
/// done.
pub async fn serve_until_signalled(
    engine: Arc<EngineHandle>,
    server: actix_web::dev::Server,
    timeout: Duration,
) -> anyhow::Result<()> {
    let handle = server.handle();
    let mut running = actix_rt::spawn(server);
    let mut signals = Signals::new()?;
    tokio::select! {
        ended = &mut running => return Ok(ended??),
        sig = signals.next() => eprintln!("{sig}: draining; requests in flight get {:.1} s to finish", timeout.as_secs_f64()),
    }
    let started = Instant::now();
    engine.health.begin_drain();
    let (idle_tx, idle_rx) = oneshot::channel();
    engine.scheduler.do_send(WhenIdle(idle_tx));
    let left = tokio::select! {
        _ = idle_rx => None,
        _ = actix_rt::time::sleep(timeout) => Some("the shutdown timeout passed"),
        sig = signals.next() => Some(if sig == "SIGTERM" { "a second SIGTERM came" } else { "a second Ctrl-C came" }),
    };
    match left {
        None => eprintln!(
            "every request finished ({:.1} s); stopping",
            started.elapsed().as_secs_f64()
        ),
        Some(why) => {
            eprintln!("{why}: ending the requests left with `shutting_down`; stopping");
            engine.scheduler.do_send(FailAll(EngineError::ShuttingDown));
        }
    }
    handle.stop(true).await;
    let _ = running.await;
    eprintln!("brook stopped");
    Ok(())
}

/// SIGTERM and SIGINT (Ctrl-C), as a stream of their names.
struct Signals {
    #[cfg(unix)]
    term: actix_rt::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Signals {
            #[cfg(unix)]
            term: actix_rt::signal::unix::signal(actix_rt::signal::unix::SignalKind::terminate())
                .map_err(|e| anyhow::anyhow!("cannot listen for SIGTERM: {e}"))?,
        })
    }

    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = actix_rt::signal::ctrl_c() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = actix_rt::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}
