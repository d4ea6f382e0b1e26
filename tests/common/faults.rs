//! Fault injection, test-only: a `Backend` wrapper that fails on purpose at a chosen engine step
//! (an error, a panic, or a hang past the step deadline). It lives in the tests, so the release
//! binary holds none of it; the engine takes it through `engine::start_wrapped`, which wraps
//! every backend it builds, so the plan (one per test) survives a rebuild after a panic.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use brook::engine::BackendWrap;
use brook::executor::backend::{Backend, BackendInfo};
use brook::step::{SchedulerOutput, StepOutput};
use parking_lot::Mutex;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// The step runs, then reports an error (as a backend whose device failed at the end would;
    /// its drops were applied first, as the `Backend` contract requires).
    Error,
    /// The step panics before it runs.
    Panic,
    /// The step sleeps this long, then runs (a hang, past the deadline if longer).
    Hang(Duration),
}

/// Which step an armed fault fires in.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// This step number, counted from 1 over every backend built.
    Step(u64),
    /// The first step that computes at least this many requests.
    Batch(usize),
}

/// What the wrapped backends share: the steps run so far and the fault to inject.
#[derive(Debug, Default)]
pub struct FaultPlan {
    steps: AtomicU64,
    /// When the fault fires, once.
    armed: Mutex<Option<(Trigger, Fault)>>,
    /// Backends built after the first report half the KV pool (and use only that part).
    shrink_rebuilt: AtomicBool,
    /// Building a backend after the first panics: a rebuild fails.
    fail_rebuild: AtomicBool,
    built: AtomicU64,
    fired: AtomicU64,
    /// Backends dropped, and the name of the thread that dropped the last one.
    dropped: AtomicU64,
    dropped_on: Mutex<Option<String>>,
}

impl FaultPlan {
    pub fn new() -> Arc<Self> {
        Arc::new(FaultPlan::default())
    }

    /// Injects `fault` into the `n`-th step from now (1 = the next one).
    pub fn arm(&self, n: u64, fault: Fault) {
        let at = self.steps.load(Ordering::SeqCst) + n;
        *self.armed.lock() = Some((Trigger::Step(at), fault));
    }

    /// Injects `fault` into the first step from now that computes at least `requests` requests
    /// (so a test of a shared step does not hang on when each request's prefill ran).
    pub fn arm_batch(&self, requests: usize, fault: Fault) {
        *self.armed.lock() = Some((Trigger::Batch(requests), fault));
    }

    pub fn shrink_rebuilt(&self) {
        self.shrink_rebuilt.store(true, Ordering::SeqCst);
    }

    pub fn fail_rebuild(&self) {
        self.fail_rebuild.store(true, Ordering::SeqCst);
    }

    /// Faults injected so far.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }

    /// Backends built (1 + rebuilds).
    pub fn built(&self) -> u64 {
        self.built.load(Ordering::SeqCst)
    }

    /// Backends dropped so far, and the thread that dropped the last one.
    pub fn dropped(&self) -> (u64, Option<String>) {
        (
            self.dropped.load(Ordering::SeqCst),
            self.dropped_on.lock().clone(),
        )
    }

    /// The wrapper to hand to `engine::start_wrapped`.
    pub fn wrap(self: &Arc<Self>) -> BackendWrap {
        let plan = self.clone();
        Arc::new(move |inner| {
            let n = plan.built.fetch_add(1, Ordering::SeqCst) + 1;
            if n > 1 && plan.fail_rebuild.load(Ordering::SeqCst) {
                panic!("injected fault: the backend cannot be built again");
            }
            let shrink = n > 1 && plan.shrink_rebuilt.load(Ordering::SeqCst);
            Box::new(FaultyBackend {
                inner,
                plan: plan.clone(),
                shrink,
            })
        })
    }

    /// The fault for a step computing `requests` requests, if one is due.
    fn next_step(&self, requests: usize) -> Option<Fault> {
        let n = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        let mut armed = self.armed.lock();
        let due = match *armed {
            Some((Trigger::Step(at), fault)) if at == n => fault,
            Some((Trigger::Batch(min), fault)) if requests >= min => fault,
            _ => return None,
        };
        *armed = None;
        self.fired.fetch_add(1, Ordering::SeqCst);
        Some(due)
    }
}

pub struct FaultyBackend {
    inner: Box<dyn Backend>,
    plan: Arc<FaultPlan>,
    shrink: bool,
}

impl Drop for FaultyBackend {
    fn drop(&mut self) {
        *self.plan.dropped_on.lock() = std::thread::current().name().map(str::to_owned);
        self.plan.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Backend for FaultyBackend {
    fn info(&self) -> BackendInfo {
        let mut info = self.inner.info();
        if self.shrink {
            info.num_kv_blocks /= 2;
        }
        info
    }

    fn execute(&mut self, step: &SchedulerOutput) -> anyhow::Result<StepOutput> {
        match self.plan.next_step(step.scheduled.len()) {
            None => self.inner.execute(step),
            Some(Fault::Error) => {
                self.inner.execute(step)?;
                anyhow::bail!("injected fault: the step failed")
            }
            Some(Fault::Panic) => panic!("injected fault: the step panicked"),
            Some(Fault::Hang(d)) => {
                std::thread::sleep(d);
                self.inner.execute(step)
            }
        }
    }
}
