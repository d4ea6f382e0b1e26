//! The executor actor: owns the backend on its own thread (an `Arbiter` of its own, where
//! nothing else runs), so a forward pass never blocks the scheduler's or the sessions' event
//! loops.
//!
//! Linger (`scheduler.prewake_us`, off on the CPU executor): after answering a step the actor
//! yields for up to that long instead of letting its thread park, because the next step comes
//! within tens of µs and a parked thread took ~40 µs to wake for it (`brook bench
//! --engine-loop`); it parks once the next step has arrived or the time is up.
//!
//! Panics stop here (`catch_unwind` around each step): a backend that panicked is in an unknown
//! state (half-applied diffs, buffers mid-update), so it is dropped and rebuilt from the
//! factory, and the step answers [`StepError::Panicked`] with the new pool's size; the
//! scheduler fails the step's requests, re-queues the others for recompute (swapped-out ones
//! too: the KV host tier is the backend's memory, rebuilt with it) and clears the prefix cache
//! in both tiers (the new backend's pools hold nothing), resizing the block manager's pools if
//! the new ones differ (a GPU's free memory may). When the rebuild fails, every later step answers
//! [`StepError::Unavailable`] and /health reports the engine failed: only a restart helps then.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Handler, Message, WrapFuture};

use crate::executor::backend::Backend;
use crate::step::{SchedulerOutput, StepOutput};

/// Builds the backend: at start and after a panic. Runs on the executor thread.
pub type BackendFactory = Box<dyn FnMut() -> anyhow::Result<Box<dyn Backend>> + Send>;

pub struct ExecutorActor {
    backend: Option<Box<dyn Backend>>,
    factory: BackendFactory,
    /// Tokens per KV block of the first backend: block ids mean nothing with another size.
    block_size: usize,
    /// Why no backend is left, once a rebuild failed.
    failed: Option<String>,
    /// Linger: how long to keep the thread awake after a step (None: park at once), and the
    /// steps started so far (the linger's end).
    linger: Option<Duration>,
    steps_started: Rc<Cell<u64>>,
}

impl ExecutorActor {
    /// Runs on the executor thread (its arbiter's); `linger`: how long to stay awake after a
    /// step for the next one (None: park at once).
    pub fn new(
        mut backend: Box<dyn Backend>,
        factory: BackendFactory,
        linger: Option<Duration>,
    ) -> Self {
        backend.on_executor_thread();
        ExecutorActor {
            block_size: backend.info().block_size,
            backend: Some(backend),
            factory,
            failed: None,
            linger,
            steps_started: Rc::default(),
        }
    }

    /// Linger: yields for up to `linger`, or until the next step arrives, so that the thread
    /// is awake for it.
    fn linger(&self, ctx: &mut Context<Self>) {
        let Some(linger) = self.linger else { return };
        let (started, at) = (self.steps_started.clone(), self.steps_started.get());
        let next_came = move || started.get() != at;
        ctx.spawn(yield_until(next_came, Instant::now() + linger).into_actor(self));
    }

    /// Drops the poisoned backend (its drop may panic too) and builds a new one; returns its
    /// KV pool's and its host tier's sizes in blocks.
    fn rebuild(&mut self) -> Result<(usize, usize), String> {
        let old = self.backend.take();
        if catch_unwind(AssertUnwindSafe(move || drop(old))).is_err() {
            tracing::error!("the poisoned backend panicked while being dropped");
        }
        let built = catch_unwind(AssertUnwindSafe(|| (self.factory)()))
            .map_err(|p| format!("rebuilding the backend panicked: {}", panic_message(&*p)))?
            .map_err(|e| format!("rebuilding the backend failed: {e:#}"))?;
        let info = built.info();
        if info.block_size != self.block_size || info.num_kv_blocks == 0 {
            return Err(format!(
                "the rebuilt backend has {} KV blocks of {} tokens; the engine's blocks hold {}",
                info.num_kv_blocks, info.block_size, self.block_size
            ));
        }
        let mut built = built;
        built.on_executor_thread();
        self.backend = Some(built);
        Ok((info.num_kv_blocks, info.num_host_blocks))
    }
}

impl Actor for ExecutorActor {
    type Context = Context<Self>;
}

/// Why a step produced no output.
#[derive(Debug, Clone, PartialEq)]
pub enum StepError {
    /// The backend returned an error; its state is intact (the step's drops were applied).
    Failed(String),
    /// The backend panicked and was rebuilt: it holds no requests, an empty KV pool of
    /// `kv_blocks` blocks and an empty KV host tier of `host_blocks` (0: none).
    Panicked {
        message: String,
        kv_blocks: usize,
        host_blocks: usize,
    },
    /// No backend: a rebuild failed. Every step fails from now on.
    Unavailable(String),
}

impl StepError {
    /// The label of `brook:engine_step_failures_total` (`timeout` is the scheduler's own).
    pub fn kind(&self) -> &'static str {
        match self {
            StepError::Failed(_) => "error",
            StepError::Panicked { .. } | StepError::Unavailable(_) => "panic",
        }
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::Failed(e) => write!(f, "engine step failed: {e}"),
            StepError::Panicked { message, .. } => {
                write!(
                    f,
                    "engine step panicked ({message}); the backend was rebuilt"
                )
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

/// Drops the backend on the executor's thread and answers once it is gone: before the process
/// exits, so that no thread is still tearing down the GPU's state (cuBLAS handles, the
/// context) while the exit handlers unload those libraries (that crashed `brook bench` at exit
/// on an H100, session 33). Later steps answer [`StepError::Unavailable`].
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReleaseBackend;

impl Handler<ReleaseBackend> for ExecutorActor {
    type Result = ();

    fn handle(&mut self, _: ReleaseBackend, _: &mut Context<Self>) {
        if let Some(b) = self.backend.take() {
            if catch_unwind(AssertUnwindSafe(move || drop(b))).is_err() {
                tracing::error!("the backend panicked while being released");
            }
        }
        self.failed = Some("the engine was shut down".into());
    }
}

impl Handler<ExecuteStep> for ExecutorActor {
    type Result = Result<StepOutput, StepError>;

    fn handle(&mut self, msg: ExecuteStep, ctx: &mut Context<Self>) -> Self::Result {
        self.steps_started.set(self.steps_started.get() + 1);
        let out = self.run(msg);
        self.linger(ctx);
        out
    }
}

impl ExecutorActor {
    /// One step, a panic caught (the backend then rebuilt).
    fn run(&mut self, msg: ExecuteStep) -> Result<StepOutput, StepError> {
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
                    Ok((kv_blocks, host_blocks)) => Err(StepError::Panicked {
                        message: what,
                        kv_blocks,
                        host_blocks,
                    }),
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

/// Keeps the calling actor's thread from parking: yields to the runtime (which polls the
/// actor's mailbox and futures each time) until `done()` or `until`. The pre-wake and linger
/// of the scheduler and executor actors: bounded polls where a parked thread's wake-up is on
/// the GPU's idle path.
pub async fn yield_until(done: impl Fn() -> bool, until: Instant) {
    while !done() && Instant::now() < until {
        tokio::task::yield_now().await;
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
