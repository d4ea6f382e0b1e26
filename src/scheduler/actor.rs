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

use std::sync::Arc;
use std::time::Instant;

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, WrapFuture};

use crate::error::EngineError;
use crate::executor::actor::{ExecuteStep, ExecutorActor};
use crate::kv::actor::KvHandle;
use crate::metrics::Metrics;
use crate::output::{OutputProcessor, Processed};
use crate::request::FinishReason;
pub use crate::scheduler::messages::{Abort, Cancel, Submit};
use crate::scheduler::{gauges, NewRequest, Scheduler};
use crate::step::{RequestUpdate, SchedulerOutput, StepOutput};
use crate::tokenizer::Tokenizer;

pub struct SchedulerActor {
    core: Scheduler,
    kv: KvHandle,
    executor: Addr<ExecutorActor>,
    output: OutputProcessor,
    metrics: Arc<Metrics>,
    in_flight: bool,
    /// The core runs on seconds since this instant.
    epoch: Instant,
}

impl SchedulerActor {
    /// Without a tokenizer (synthetic models) deltas carry token counts only.
    pub fn new(
        core: Scheduler,
        kv: KvHandle,
        executor: Addr<ExecutorActor>,
        tokenizer: Option<Arc<Tokenizer>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        SchedulerActor {
            output: OutputProcessor::new(tokenizer, metrics.clone()),
            core,
            kv,
            executor,
            metrics,
            in_flight: false,
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
        let plan = Arc::new(plan);
        let fut = self.executor.send(ExecuteStep(plan.clone()));
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            act.in_flight = false;
            match res.map_err(|e| format!("executor unavailable: {e}")) {
                Ok(Ok(step)) => {
                    gauges::observe_step(&act.metrics, &act.core, &plan, &step);
                    let updates = act.fold(&plan, &step);
                    act.maybe_step(ctx); // the next step runs while this one's output is processed
                    act.emit(&updates);
                }
                Ok(Err(e)) | Err(e) => act.fail_step(&plan, &e, ctx),
            }
        }));
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
    }

    fn fail_step(&mut self, plan: &SchedulerOutput, e: &str, ctx: &mut Context<Self>) {
        tracing::error!("engine step failed: {e}");
        let mut done = Processed::default();
        // Requests whose blocks the step's copies were bringing back failed with it.
        for id in plan
            .scheduled
            .iter()
            .map(|s| s.id)
            .chain(plan.loading.iter().copied())
        {
            let err = EngineError::Internal(format!("engine step failed: {e}"));
            self.output.fail(id, err, &mut done);
        }
        self.apply(done);
        self.maybe_step(ctx);
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;
}

impl Handler<Submit> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        let prompt_tokens = msg.request.prompt_token_ids().len();
        let n = msg.request.n();
        let text = self.output.text_output(&msg.request);
        let new = NewRequest::from_valid(msg.id, msg.request);
        let admission = self.core.add_request(new, self.secs(msg.arrival));
        if let Some(err) = admission.to_error() {
            gauges::sync_scheduler(&self.metrics, &self.core);
            return OutputProcessor::reject(&msg.tx, err);
        }
        self.output
            .add_request(msg.id, n, prompt_tokens, text, msg.tx, msg.arrival);
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
