//! The scheduler actor: a thin loop around the pure `Scheduler` core and the pure
//! `OutputProcessor`. One step: `schedule()` → `ExecuteStep` on the executor thread →
//! `update_from_output()` → dispatch the next step → hand the updates to the output processor
//! (detokenize, stop strings, events) while the executor runs that next step. With no work the
//! actor waits for a `Submit` (no polling).
//!
//! KV safety of the overlap: a request a stop string finishes (or whose channel closed) during
//! output processing may be in the step already in flight. Its blocks are freed at once, but
//! only the next `schedule()` hands blocks out again, and that runs after the in-flight step
//! has returned (one step at a time); the core drops that step's results for the gone request.
//!
//! Failed steps (see `executor::actor`): an error or a panic fails the step's requests with
//! `internal`; after a panic the backend was rebuilt, so the other running requests are
//! re-queued to recompute and the prefix cache is cleared (the block manager resized if the new
//! pool differs); with no backend left the engine reports itself failed and fails everything. A step deadline (`scheduler.step_timeout_s`) is
//! one timer armed per step and cancelled when the step returns (no polling): past it the
//! engine is *stalled*: every request ends with `internal`, new ones are refused with
//! `unavailable`, and blocks stay unallocated until the step returns (it may still write them),
//! after which the engine serves again.
//!
//! Pre-wake (`scheduler.prewake_us`): a thread parked while the GPU works takes ~50 µs to wake
//! on a VM when the step's result arrives, and the executor's thread about as long again when
//! the next step does, both on the GPU's idle path (`brook bench --engine-loop`). So a timer
//! armed with each step fires `prewake_us` (and the timers' 2 ms slack) before the fitted
//! model's predicted end, and from then until the step returns (or `prewake_us` past the
//! predicted end) the actor yields instead of letting its thread park, so the result is taken
//! at once. This is the one place the actor polls: measured, bounded, and off on the CPU
//! executor. The executor actor lingers after each step likewise (`executor::actor`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, SpawnHandle, WrapFuture};
use tokio::sync::oneshot;

use crate::error::EngineError;
use crate::executor::actor::{yield_until, ExecuteStep, ExecutorActor, ReleaseBackend, StepError};
use crate::health::Health;
use crate::kv::actor::KvHandle;
use crate::metrics::Metrics;
use crate::output::{OutputProcessor, Processed};
use crate::request::FinishReason;
pub use crate::scheduler::messages::{Abort, Cancel, FailAll, Shutdown, Submit, WhenIdle};
use crate::scheduler::{gauges, NewRequest, Scheduler, StepFeatures};
use crate::step::{RequestUpdate, SchedulerOutput, StepOutput};
use crate::tokenizer::Tokenizer;

/// How late the runtime's timers may fire: they tick in whole milliseconds, and one armed for
/// 2.7 ms fired after 2.1-4.2 ms here (a pre-wake timer is armed this much earlier).
const TIMER_TICK: Duration = Duration::from_millis(2);

pub struct SchedulerActor {
    core: Scheduler,
    kv: KvHandle,
    executor: Addr<ExecutorActor>,
    output: OutputProcessor,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    in_flight: bool,
    /// A step running past this long stalls the engine; `None`: no deadline.
    step_timeout: Option<Duration>,
    /// The running step's deadline timer.
    deadline: Option<SpawnHandle>,
    /// Pre-wake: how long before a step's predicted end to stop sleeping (None: off), the
    /// running step's timer, and the steps returned so far (the spin's end).
    prewake: Option<Duration>,
    prewake_timer: Option<SpawnHandle>,
    steps_returned: std::rc::Rc<std::cell::Cell<u64>>,
    /// Set while a step runs past its deadline.
    stalled: bool,
    /// Drains waiting for the engine to run out of requests.
    idle_waiters: Vec<oneshot::Sender<()>>,
    /// The core runs on seconds since this instant.
    epoch: Instant,
}

/// What the scheduler actor needs besides its core and the backend's address.
pub struct SchedulerParts {
    pub kv: KvHandle,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub step_timeout: Option<Duration>,
    /// `scheduler.prewake_us` (None: off).
    pub prewake: Option<Duration>,
}

impl SchedulerActor {
    /// Without a tokenizer (synthetic models) deltas carry token counts only.
    pub fn new(core: Scheduler, executor: Addr<ExecutorActor>, parts: SchedulerParts) -> Self {
        SchedulerActor {
            output: OutputProcessor::new(parts.tokenizer, parts.metrics.clone()),
            core,
            kv: parts.kv,
            executor,
            metrics: parts.metrics,
            health: parts.health,
            in_flight: false,
            step_timeout: parts.step_timeout,
            deadline: None,
            prewake: parts.prewake,
            prewake_timer: None,
            steps_returned: Default::default(),
            stalled: false,
            idle_waiters: Vec::new(),
            epoch: Instant::now(),
        }
    }

    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_secs_f64()
    }

    /// Starts a step unless one is in flight or there is nothing to do.
    fn maybe_step(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || !self.core.has_unfinished() {
            return;
        }
        let now = Instant::now();
        let plan = self.core.schedule(&mut self.kv.lock(), self.secs(now));
        self.output.scheduled(&plan.admitted, now);
        if plan.is_empty() {
            // Only requests the core finished without running; admission guarantees progress
            // otherwise, so say so rather than spin.
            let updates = self.fold(&plan, &StepOutput::default());
            self.emit(&updates);
            if updates.is_empty() {
                tracing::error!(waiting = self.core.num_waiting(), "empty scheduler step");
                return;
            }
            return self.maybe_step(ctx);
        }
        self.in_flight = true;
        if let Some(timeout) = self.step_timeout {
            let started = now;
            let h = ctx.run_later(timeout, move |act, _| act.step_overdue(started, timeout));
            self.deadline = Some(h);
        }
        self.arm_prewake(&plan, ctx);
        let plan = Arc::new(plan);
        let fut = self.executor.send(ExecuteStep(plan.clone()));
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            act.in_flight = false;
            act.steps_returned.set(act.steps_returned.get() + 1);
            if let Some(h) = act.deadline.take() {
                ctx.cancel_future(h);
            }
            if let Some(h) = act.prewake_timer.take() {
                ctx.cancel_future(h);
            }
            if std::mem::take(&mut act.stalled) {
                tracing::warn!("the overdue engine step returned; serving again");
                act.health.set_stalled(None);
            }
            let res = res.unwrap_or_else(|e| Err(StepError::Unavailable(e.to_string())));
            match res {
                Ok(step) => {
                    gauges::observe_step(&act.metrics, &act.core, &plan, &step);
                    let updates = act.fold(&plan, &step);
                    act.maybe_step(ctx); // the next step runs while this one's output is processed
                    act.emit(&updates);
                }
                Err(e) => act.fail_step(&plan, e, ctx),
            }
        }));
    }

    /// Pre-wake: arms the timer that stops the thread sleeping `prewake` before `plan`'s
    /// predicted end (now, for a step predicted shorter), once the step-time model is fitted.
    fn arm_prewake(&mut self, plan: &SchedulerOutput, ctx: &mut Context<Self>) {
        let Some(early) = self.prewake else { return };
        let model = self.core.cost_model();
        if !model.is_fitted() {
            return;
        }
        let ms = model.predict_ms(&StepFeatures::from_step(plan));
        let Ok(predicted) = Duration::try_from_secs_f64(ms / 1e3) else {
            return;
        };
        let step = self.steps_returned.get() + 1;
        let started = Instant::now();
        let h = ctx.run_later(
            predicted.saturating_sub(early + TIMER_TICK),
            move |act, ctx| {
                act.prewake_timer = None;
                let returned = act.steps_returned.clone();
                let step_returned = move || returned.get() >= step;
                // Up to the predicted end and `early` past it, at most.
                let until = started + predicted + early;
                ctx.spawn(yield_until(step_returned, until).into_actor(act));
            },
        );
        self.prewake_timer = Some(h);
    }

    fn fold(&mut self, plan: &SchedulerOutput, step: &StepOutput) -> Vec<RequestUpdate> {
        let now = self.secs(Instant::now());
        (self.core).update_from_output(plan, step, &mut self.kv.lock(), now)
    }

    /// Output processing of one step's updates; what it decided goes back to the core.
    fn emit(&mut self, updates: &[RequestUpdate]) {
        let suspend = self.core.non_core_metrics_suspended();
        let done = self.output.process(updates, Instant::now(), suspend);
        self.apply(done);
    }

    fn apply(&mut self, done: Processed) {
        let mut kv = self.kv.lock();
        for id in done.stopped {
            self.core.finish_request(id, FinishReason::Stop, &mut kv);
        }
        for id in done.aborted {
            self.core.abort_request(id, &mut kv);
        }
        gauges::sync_all(&self.metrics, &self.core, &kv);
        drop(kv);
        for b in done.blocked {
            actix::spawn(b.deliver());
        }
        if !self.core.has_unfinished() {
            for w in self.idle_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// Ends every request with `err` (`FailAll`, a stall, a backend that is gone).
    fn fail_all(&mut self, err: &EngineError) {
        let mut done = Processed::default();
        for id in self.output.ids() {
            self.output.fail(id, err.clone(), &mut done);
        }
        // The core holds nothing the processor does not; this is belt and braces.
        let mut kv = self.kv.lock();
        for id in self.core.request_ids() {
            self.core.abort_request(id, &mut kv);
        }
        drop(kv);
        self.apply(done);
    }

    fn fail_step(&mut self, plan: &SchedulerOutput, e: StepError, ctx: &mut Context<Self>) {
        tracing::error!("{e}");
        self.metrics
            .step_failures
            .with_label_values(&[e.kind()])
            .inc();
        // Requests the core ended while planning the step did not run: they end as planned.
        let early = SchedulerOutput {
            finished_early: plan.finished_early.clone(),
            ..Default::default()
        };
        let early = self.fold(&early, &StepOutput::default());
        self.emit(&early);
        let mut done = Processed::default();
        // Requests whose blocks the step's copies were bringing back failed with it.
        for id in plan
            .scheduled
            .iter()
            .map(|s| s.id)
            .chain(plan.loading.iter().copied())
        {
            self.output
                .fail(id, EngineError::Internal(e.to_string()), &mut done);
        }
        self.apply(done);
        match &e {
            StepError::Failed(_) => {}
            &StepError::Panicked {
                kv_blocks,
                host_blocks,
                ..
            } => {
                let mut kv = self.kv.lock();
                let requeued = self.core.executor_lost(&mut kv);
                let forgotten = kv.reset_prefix_cache();
                if kv_blocks != kv.num_blocks() {
                    tracing::warn!(
                        "the rebuilt backend's KV pool has {kv_blocks} blocks, not {}",
                        kv.num_blocks()
                    );
                    kv.resize_pool(kv_blocks);
                }
                if host_blocks != kv.num_host_blocks() {
                    tracing::warn!(
                        "the rebuilt backend's KV host tier has {host_blocks} blocks, not {}",
                        kv.num_host_blocks()
                    );
                    kv.resize_host_tier(host_blocks);
                }
                gauges::sync_all(&self.metrics, &self.core, &kv);
                tracing::warn!(
                    requeued,
                    forgotten,
                    "backend rebuilt: requests re-queued to recompute, prefix cache cleared"
                );
            }
            StepError::Unavailable(why) => {
                self.health.set_failed(why.clone());
                self.fail_all(&EngineError::Internal(e.to_string()));
            }
        }
        self.maybe_step(ctx);
    }

    /// The running step's deadline passed: the engine is stalled until it returns.
    fn step_overdue(&mut self, started: Instant, timeout: Duration) {
        self.deadline = None;
        if !self.in_flight {
            return;
        }
        tracing::error!(
            "an engine step has run for {:.1} s, past its {:.1} s deadline: failing every request until it returns",
            started.elapsed().as_secs_f64(),
            timeout.as_secs_f64()
        );
        self.metrics
            .step_failures
            .with_label_values(&["timeout"])
            .inc();
        self.stalled = true;
        self.health.set_stalled(Some(started));
        let err = EngineError::Internal(format!(
            "an engine step ran past its deadline of {:.1} s (scheduler.step_timeout_s)",
            timeout.as_secs_f64()
        ));
        self.fail_all(&err);
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;
}

impl Handler<Submit> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        if let Some(err) = self.health.admission_error() {
            return OutputProcessor::reject(&msg.tx, err);
        }
        if let Some(b) = msg.backlog.as_ref().filter(|b| b.is_tripped()) {
            let err = EngineError::SlowConsumer {
                unread_bytes: b.bytes(),
                limit: b.limit(),
            };
            return OutputProcessor::reject(&msg.tx, err);
        }
        let prompt_tokens = msg.request.prompt_token_ids().len();
        let n = msg.request.n();
        let text = self.output.text_output(&msg.request);
        let new = NewRequest::from_valid(msg.id, msg.request);
        let admission = self.core.add_request(new, self.secs(msg.arrival));
        if let Some(err) = admission.to_error() {
            gauges::sync_scheduler(&self.metrics, &self.core);
            return OutputProcessor::reject(&msg.tx, err);
        }
        self.output.add_request(
            msg.id,
            n,
            prompt_tokens,
            text,
            msg.tx,
            msg.backlog,
            msg.arrival,
        );
        self.maybe_step(ctx);
    }
}

impl Handler<Cancel> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Cancel, _ctx: &mut Context<Self>) {
        let mut done = Processed::default();
        self.output.cancel(msg.id, Instant::now(), &mut done);
        self.apply(done);
    }
}

impl Handler<Abort> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Abort, _ctx: &mut Context<Self>) {
        let mut done = Processed::default();
        for id in msg.ids {
            self.output.abort(id, &mut done);
        }
        self.apply(done);
    }
}

impl Handler<WhenIdle> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: WhenIdle, _ctx: &mut Context<Self>) {
        if self.core.has_unfinished() {
            self.idle_waiters.push(msg.0);
        } else {
            let _ = msg.0.send(());
        }
    }
}

impl Handler<Shutdown> for SchedulerActor {
    type Result = actix::ResponseFuture<()>;

    fn handle(&mut self, _: Shutdown, _ctx: &mut Context<Self>) -> Self::Result {
        if self.core.has_unfinished() {
            self.fail_all(&EngineError::ShuttingDown);
        }
        // Queued behind a step in flight, if any: the executor handles one message at a time.
        let release = self.executor.send(ReleaseBackend);
        Box::pin(async move {
            let _ = release.await;
        })
    }
}

impl Handler<FailAll> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: FailAll, _ctx: &mut Context<Self>) {
        if self.core.has_unfinished() {
            tracing::warn!(
                requests = self.core.request_ids().len(),
                "ending the requests left: {}",
                msg.0
            );
        }
        self.fail_all(&msg.0);
    }
}
