//! The engine's health, one per engine, shared by the scheduler actor (which sets it), admission
//! (which refuses work it cannot do) and `/health` (which reports it):
//! - serving;
//! - draining: SIGTERM or Ctrl-C came; new requests get `shutting_down`, accepted ones finish
//!   within `server.shutdown_timeout_s` (serve.rs); sessions close once their requests ended;
//! - stalled: an engine step ran past `scheduler.step_timeout_s`; its requests and every other
//!   one ended with `internal`, new ones get `unavailable` until the step returns;
//! - failed: the backend panicked and could not be rebuilt; new requests get `unavailable`
//!   for good (only a restart helps), so /health fails and an orchestrator can restart it.
//!
//! Draining is also a `watch` channel, so sessions learn of it without polling.

use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::EngineError;

#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Serving,
    Draining,
    /// A step has been running for `for_s` seconds, past the deadline.
    Stalled {
        for_s: f64,
    },
    Failed(String),
}

impl Status {
    /// The `status` field of `/health`.
    pub fn label(&self) -> &'static str {
        match self {
            Status::Serving => "ok",
            Status::Draining => "draining",
            Status::Stalled { .. } => "stalled",
            Status::Failed(_) => "failed",
        }
    }

    pub fn is_serving(&self) -> bool {
        *self == Status::Serving
    }
}

#[derive(Debug, Default)]
struct Engine {
    stalled_since: Option<Instant>,
    failed: Option<String>,
}

#[derive(Debug)]
pub struct Health {
    drain: watch::Sender<bool>,
    engine: Mutex<Engine>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            drain: watch::Sender::new(false),
            engine: Mutex::new(Engine::default()),
        }
    }
}

impl Health {
    /// What `/health` reports: a failed engine before a stalled one before draining.
    pub fn status(&self) -> Status {
        let e = self.engine.lock();
        if let Some(why) = &e.failed {
            Status::Failed(why.clone())
        } else if let Some(since) = e.stalled_since {
            Status::Stalled {
                for_s: since.elapsed().as_secs_f64(),
            }
        } else if self.is_draining() {
            Status::Draining
        } else {
            Status::Serving
        }
    }

    /// Starts draining; false when it had started already.
    pub fn begin_drain(&self) -> bool {
        !self.drain.send_replace(true)
    }

    pub fn is_draining(&self) -> bool {
        *self.drain.borrow()
    }

    /// Changes to `true` once draining starts.
    pub fn subscribe_drain(&self) -> watch::Receiver<bool> {
        self.drain.subscribe()
    }

    pub fn set_stalled(&self, since: Option<Instant>) {
        self.engine.lock().stalled_since = since;
    }

    pub fn set_failed(&self, why: String) {
        self.engine.lock().failed.get_or_insert(why);
    }

    /// Why a new request cannot be accepted now, if it cannot.
    pub fn admission_error(&self) -> Option<EngineError> {
        match self.status() {
            Status::Serving => None,
            Status::Draining => Some(EngineError::ShuttingDown),
            Status::Stalled { for_s } => Some(EngineError::Unavailable(format!(
                "an engine step has been running for {for_s:.1} s, past its deadline"
            ))),
            Status::Failed(why) => Some(EngineError::Unavailable(format!("engine failed: {why}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_outranks_stalled_outranks_draining() {
        let h = Health::default();
        assert_eq!(h.status(), Status::Serving);
        assert_eq!(h.admission_error(), None);
        let mut rx = h.subscribe_drain();
        assert!(h.begin_drain());
        assert!(!h.begin_drain(), "a second signal does not start it again");
        assert!(rx.has_changed().unwrap() && *rx.borrow_and_update());
        assert_eq!(h.status(), Status::Draining);
        assert_eq!(h.admission_error(), Some(EngineError::ShuttingDown));
        h.set_stalled(Some(Instant::now()));
        assert_eq!(h.status().label(), "stalled");
        assert_eq!(h.admission_error().unwrap().code(), "unavailable");
        h.set_failed("rebuild failed".into());
        assert_eq!(h.status(), Status::Failed("rebuild failed".into()));
        h.set_stalled(None);
        h.set_failed("a later reason".into());
        assert_eq!(h.status(), Status::Failed("rebuild failed".into()));
    }
}
