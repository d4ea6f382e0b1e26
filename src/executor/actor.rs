//! The executor actor: owns the backend on its own thread (a one-thread `SyncArbiter`), so a
//! forward pass never blocks the scheduler's or the sessions' event loops.
//!
//! Panics stop here (`catch_unwind` around each step): a backend that panicked is in an unknown
//! state (half-applied diffs, buffers mid-update), so it is dropped and rebuilt from the
//! factory, and the step answers [`StepError::Panicked`]; the scheduler fails the step's
//! requests, re-queues the others for recompute and clears the prefix cache (the new backend's
//! KV pool holds nothing). When the rebuild fails, or gives a smaller KV pool than the one the
//! block manager hands out, every later step answers [`StepError::Unavailable`] and /health
//! reports the engine failed: only a restart helps then.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use actix::{Actor, Handler, Message, SyncContext};

use crate::executor::backend::{Backend, BackendInfo};
use crate::step::{SchedulerOutput, StepOutput};

/// Builds the backend: at start and after a panic. Runs on the executor thread.
pub type BackendFactory = Box<dyn FnMut() -> anyhow::Result<Box<dyn Backend>> + Send>;

pub struct ExecutorActor {
    backend: Option<Box<dyn Backend>>,
    factory: BackendFactory,
    /// The first backend's geometry: a rebuilt one must offer at least its KV blocks.
    info: BackendInfo,
    /// Why no backend is left, once a rebuild failed.
    failed: Option<String>,
}

impl ExecutorActor {
    pub fn new(backend: Box<dyn Backend>, factory: BackendFactory) -> Self {
        ExecutorActor {
            info: backend.info(),
            backend: Some(backend),
            factory,
            failed: None,
        }
    }

    /// Drops the poisoned backend (its drop may panic too) and builds a new one.
    fn rebuild(&mut self) -> Result<(), String> {
        let old = self.backend.take();
        if catch_unwind(AssertUnwindSafe(move || drop(old))).is_err() {
            tracing::error!("the poisoned backend panicked while being dropped");
        }
        let built = catch_unwind(AssertUnwindSafe(|| (self.factory)()))
            .map_err(|p| format!("rebuilding the backend panicked: {}", panic_message(&*p)))?
            .map_err(|e| format!("rebuilding the backend failed: {e:#}"))?;
        let (new, old) = (built.info(), &self.info);
        if new.block_size != old.block_size || new.num_kv_blocks < old.num_kv_blocks {
            return Err(format!(
                "the rebuilt backend has {} KV blocks of {} tokens, the engine hands out {} of {}",
                new.num_kv_blocks, new.block_size, old.num_kv_blocks, old.block_size
            ));
        }
        self.backend = Some(built);
        Ok(())
    }
}

impl Actor for ExecutorActor {
    type Context = SyncContext<Self>;
}

/// Why a step produced no output.
#[derive(Debug, Clone, PartialEq)]
pub enum StepError {
    /// The backend returned an error; its state is intact (the step's drops were applied).
    Failed(String),
    /// The backend panicked and was rebuilt: it holds no requests and an empty KV pool.
    Panicked(String),
    /// No backend: a rebuild failed. Every step fails from now on.
    Unavailable(String),
}

impl StepError {
    /// The label of `brook:engine_step_failures_total` (`timeout` is the scheduler's own).
    pub fn kind(&self) -> &'static str {
        match self {
            StepError::Failed(_) => "error",
            StepError::Panicked(_) | StepError::Unavailable(_) => "panic",
        }
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::Failed(e) => write!(f, "engine step failed: {e}"),
            StepError::Panicked(e) => {
                write!(f, "engine step panicked ({e}); the backend was rebuilt")
            }
            StepError::Unavailable(e) => write!(f, "no engine backend: {e}"),
        }
    }
}

/// Run one engine step. The plan is shared (not copied) with the scheduler, which needs it
/// again in `update_from_output`.
pub struct ExecuteStep(pub Arc<SchedulerOutput>);

impl Message for ExecuteStep {
    type Result = Result<StepOutput, StepError>;
}

impl Handler<ExecuteStep> for ExecutorActor {
    type Result = Result<StepOutput, StepError>;

    fn handle(&mut self, msg: ExecuteStep, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let Some(backend) = self.backend.as_mut() else {
            let why = self.failed.clone().unwrap_or_default();
            return Err(StepError::Unavailable(why));
        };
        match catch_unwind(AssertUnwindSafe(|| backend.execute(&msg.0))) {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(StepError::Failed(format!("{e:#}"))),
            Err(payload) => {
                let what = panic_message(&*payload);
                tracing::error!("backend panicked in a step: {what}; rebuilding it");
                match self.rebuild() {
                    Ok(()) => Err(StepError::Panicked(what)),
                    Err(why) => {
                        tracing::error!("{why}; the engine cannot run steps any more");
                        let why = format!("the backend panicked ({what}); {why}");
                        self.failed = Some(why.clone());
                        Err(StepError::Unavailable(why))
                    }
                }
            }
        }
    }
}

/// The text a panic carried (`panic!` with a literal or a formatted message).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}
