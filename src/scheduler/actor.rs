//! The scheduler actor: a thin loop around the pure `Scheduler` core.
//!
//! One engine step = `schedule()` → `ExecuteStep` to the executor thread → `update_from_output()`
//! → per-request detokenization and stop strings → at most one delta per request. A new step
//! starts as soon as the previous one returns while there is work; with no work the actor sleeps
//! until a `Submit` arrives (no polling). Each request's events go out over its own bounded
//! channel; while it is full, text merges into the next delta, and a closed channel cancels.
//!
//! Without a tokenizer (synthetic models in `brook bench`) there is no text: each step's delta
//! carries only its token count, and requests with stop strings are refused.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, WrapFuture};
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::error::EngineError;
use crate::executor::actor::{ExecuteStep, ExecutorActor};
use crate::kv::actor::KvHandle;
use crate::metrics::Metrics;
use crate::output::{OutputUpdate, RequestOutput};
use crate::request::{FinishReason, RequestId, StreamEvent, Timing, Usage};
use crate::sampling::params::SamplingParams;
use crate::scheduler::{
    Admission, MergeReason, NewRequest, OverloadReason, RequestClass, Scheduler, SchedulerOutput,
};
use crate::step::StepOutput;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct SchedulerLimits {
    /// Longest prompt admitted: one output token must still fit in the context window and in
    /// the KV pool (both fixed at start, so computed once).
    pub max_prompt_tokens: usize,
    pub eos_token_ids: Arc<[u32]>,
}

/// A new request. Its events (admission errors too) go to `tx`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submit {
    pub id: RequestId,
    pub prompt_token_ids: Vec<u32>,
    pub params: SamplingParams,
    pub tx: mpsc::Sender<StreamEvent>,
    pub arrival: Instant,
}

/// The client cancelled: the request ends with `done` / `cancelled`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cancel {
    pub id: RequestId,
}

/// The client went away: drop the requests silently and free their blocks.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Abort {
    pub ids: Vec<RequestId>,
}

/// Per-request state the actor keeps beside the core: the stream and its timing.
struct Tracked {
    tx: mpsc::Sender<StreamEvent>,
    /// Detokenizer and stop strings; `None` on an engine without a tokenizer.
    output: Option<RequestOutput>,
    pending_text: String,
    pending_tokens: usize,
    prompt_tokens: usize,
    completion_tokens: usize,
    arrival: Instant,
    scheduled_at: Option<Instant>,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

impl Tracked {
    /// Whether a delta is due: text to send, or, with no text to wait for, tokens to count.
    fn has_pending(&self) -> bool {
        !self.pending_text.is_empty() || (self.output.is_none() && self.pending_tokens > 0)
    }
}

pub struct SchedulerActor {
    core: Scheduler,
    kv: KvHandle,
    executor: Addr<ExecutorActor>,
    /// `None`: token-level engine; deltas carry counts, not text.
    tokenizer: Option<Arc<Tokenizer>>,
    metrics: Arc<Metrics>,
    limits: SchedulerLimits,
    requests: HashMap<RequestId, Tracked>,
    in_flight: bool,
    /// The core runs on seconds since this instant.
    epoch: Instant,
}

impl SchedulerActor {
    pub fn new(
        core: Scheduler,
        kv: KvHandle,
        executor: Addr<ExecutorActor>,
        tokenizer: Option<Arc<Tokenizer>>,
        metrics: Arc<Metrics>,
        limits: SchedulerLimits,
    ) -> Self {
        SchedulerActor {
            core,
            kv,
            executor,
            tokenizer,
            metrics,
            limits,
            requests: HashMap::new(),
            in_flight: false,
            epoch: Instant::now(),
        }
    }

    fn reject(&self, tx: &mpsc::Sender<StreamEvent>, err: EngineError) {
        self.metrics
            .request_errors
            .with_label_values(&[err.code()])
            .inc();
        // A fresh channel has room for at least two events.
        let _ = tx.try_send(StreamEvent::Error(err));
    }

    fn admission_error(&self, prompt_tokens: usize) -> Option<EngineError> {
        let limit = self.limits.max_prompt_tokens;
        if prompt_tokens > limit {
            return Some(EngineError::PromptTooLong {
                prompt_tokens,
                limit,
            });
        }
        None
    }

    /// Seconds since the actor started: the core's clock.
    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_secs_f64()
    }

    /// Copies the core's cumulative decision counters into the metrics.
    fn sync_scheduler_metrics(&self) {
        let m = &self.metrics;
        let st = self.core.stats();
        for r in MergeReason::ALL {
            sync(
                &m.merge_decisions.with_label_values(&[r.as_str()]),
                st.merge_count(r),
            );
        }
        for r in OverloadReason::ALL {
            sync(
                &m.overloaded.with_label_values(&[r.as_str()]),
                st.overloaded_count(r),
            );
        }
        for c in RequestClass::ALL {
            sync(
                &m.accepted.with_label_values(&[c.as_str()]),
                st.accepted[c.index()],
            );
        }
        sync(&m.preemptions, st.preemptions);
        sync(&m.emergency_pauses, st.emergency_pauses);
        sync(&m.emergency_pauses_spared, st.emergency_pauses_spared);
        sync(&m.emergency_entries, st.emergency_entries);
        sync(&m.emergency_exits, st.emergency_exits);
        m.emergency_mode.set(self.core.in_emergency() as i64);
        m.speculative_depth
            .set(self.core.speculative_depth() as i64);
    }

    fn update_gauges(&self) {
        self.sync_scheduler_metrics();
        let m = &self.metrics;
        m.requests_running.set(self.core.num_running() as i64);
        m.requests_waiting.set(self.core.num_waiting() as i64);
        let (u, prefix) = {
            let kv = self.kv.lock();
            (kv.usage(), kv.prefix_cache_stats())
        };
        m.kv_blocks_used.set(u.used_blocks as i64);
        m.kv_blocks_total.set(u.total_blocks as i64);
        m.kv_usage_ratio.set(u.usage_ratio());
        // The manager counts cumulatively; the counters follow it.
        m.prefix_cache_queries.inc_by(
            prefix
                .queried_tokens
                .saturating_sub(m.prefix_cache_queries.get()),
        );
        m.prefix_cache_hits
            .inc_by(prefix.hit_tokens.saturating_sub(m.prefix_cache_hits.get()));
    }

    /// Starts a step unless one is in flight or there is nothing to do.
    fn maybe_step(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight {
            return;
        }
        if !self.core.has_unfinished() {
            self.update_gauges();
            return;
        }
        let plan = {
            let mut kv = self.kv.lock();
            self.core.schedule(&mut kv, self.secs(Instant::now()))
        };
        let now = Instant::now();
        for id in &plan.admitted {
            if let Some(t) = self.requests.get_mut(id) {
                t.scheduled_at.get_or_insert(now);
            }
        }
        if plan.is_empty() {
            // Nothing to run. Requests the core finished without running (finished_early)
            // still come back through update_from_output; then try again, since that freed
            // room. With no such progress, admission guarantees this cannot happen, so say so
            // rather than spin.
            let progressed = !plan.finished_early.is_empty();
            self.on_step_done(&plan, Ok(StepOutput::default()));
            if progressed {
                self.maybe_step(ctx);
            } else {
                tracing::error!(
                    running = self.core.num_running(),
                    waiting = self.core.num_waiting(),
                    "scheduler produced an empty step"
                );
            }
            return;
        }
        self.update_gauges();
        self.in_flight = true;
        let plan = Arc::new(plan);
        let fut = self.executor.send(ExecuteStep(plan.clone()));
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            act.in_flight = false;
            let res = res
                .map_err(|e| format!("executor unavailable: {e}"))
                .and_then(|r| r);
            act.on_step_done(&plan, res);
            act.maybe_step(ctx);
        }));
    }

    fn on_step_done(&mut self, plan: &SchedulerOutput, res: Result<StepOutput, String>) {
        let step = match res {
            Ok(step) => step,
            Err(e) => {
                tracing::error!("engine step failed: {e}");
                let mut kv = self.kv.lock();
                for s in &plan.scheduled {
                    self.core.abort_request(s.id, &mut kv);
                    if let Some(t) = self.requests.remove(&s.id) {
                        let err = EngineError::Internal(format!("engine step failed: {e}"));
                        self.metrics
                            .request_errors
                            .with_label_values(&[err.code()])
                            .inc();
                        send_terminal(t.tx, vec![StreamEvent::Error(err)]);
                    }
                }
                return;
            }
        };
        let non_core_suspended = self.core.non_core_metrics_suspended();
        if !plan.is_empty() {
            self.metrics.step_time.observe(step.elapsed.as_secs_f64());
            if !non_core_suspended {
                self.metrics
                    .step_tokens
                    .observe(plan.total_num_scheduled_tokens() as f64);
            }
        }
        let now = Instant::now();
        let updates = {
            let mut kv = self.kv.lock();
            self.core
                .update_from_output(plan, &step, &mut kv, self.secs(now))
        };
        for u in updates {
            let Some(t) = self.requests.get_mut(&u.id) else {
                continue;
            };
            let n = u.new_token_ids.len();
            if n > 0 {
                match t.last_token_at {
                    None => self.metrics.ttft.observe((now - t.arrival).as_secs_f64()),
                    // Per-token ITL is a non-core metric: emergency mode suspends it.
                    Some(last) if !non_core_suspended => {
                        let per_token = (now - last).as_secs_f64() / n as f64;
                        for _ in 0..n {
                            self.metrics.itl.observe(per_token);
                        }
                    }
                    Some(_) => {}
                }
                t.first_token_at.get_or_insert(now);
                t.last_token_at = Some(now);
                t.completion_tokens += n;
                self.metrics.generation_tokens.inc_by(n as u64);
            }
            let out = match (&mut t.output, &self.tokenizer) {
                (Some(output), Some(tok)) => output.push_tokens(tok, &u.new_token_ids),
                _ => OutputUpdate::default(),
            };
            t.pending_text.push_str(&out.text);
            t.pending_tokens += n;
            let finished = match (u.finished, out.stopped_by_string) {
                (Some(reason), _) => Some(reason),
                (None, true) => {
                    self.core
                        .finish_request(u.id, FinishReason::Stop, &mut self.kv.lock());
                    Some(FinishReason::Stop)
                }
                (None, false) => None,
            };
            match finished {
                Some(reason) => {
                    let mut t = self.requests.remove(&u.id).expect("tracked above");
                    if let (false, Some(output), Some(tok)) =
                        (out.stopped_by_string, &mut t.output, &self.tokenizer)
                    {
                        let rest = output.finish(tok);
                        t.pending_text.push_str(&rest);
                    }
                    self.finish(t, reason, now);
                }
                None => {
                    if !flush(t) {
                        // Closed channel: the client is gone.
                        self.requests.remove(&u.id);
                        self.core.abort_request(u.id, &mut self.kv.lock());
                    }
                }
            }
        }
        self.update_gauges();
    }

    fn finish(&self, mut t: Tracked, reason: FinishReason, now: Instant) {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let timing = Timing {
            queue_ms: t
                .scheduled_at
                .map(|s| ms(s - t.arrival))
                .unwrap_or_else(|| ms(now - t.arrival)),
            ttft_ms: t.first_token_at.map(|s| ms(s - t.arrival)).unwrap_or(0.0),
            total_ms: ms(now - t.arrival),
        };
        self.metrics
            .requests_finished
            .with_label_values(&[reason.as_str()])
            .inc();
        self.metrics.e2e_latency.observe(timing.total_ms / 1e3);
        if let Some(s) = t.scheduled_at {
            self.metrics
                .queue_time
                .observe((s - t.arrival).as_secs_f64());
        }
        let mut events = Vec::with_capacity(2);
        if t.has_pending() {
            events.push(StreamEvent::Delta {
                text: std::mem::take(&mut t.pending_text),
                tokens: t.pending_tokens,
            });
        }
        events.push(StreamEvent::Done {
            finish_reason: reason,
            usage: Usage {
                prompt_tokens: t.prompt_tokens,
                completion_tokens: t.completion_tokens,
            },
            timing,
        });
        send_terminal(t.tx, events);
    }
}

/// Raises a counter to a cumulative total kept elsewhere.
fn sync(counter: &prometheus::IntCounter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

/// Sends the pending delta if the channel has room. Returns false when the channel is closed.
fn flush(t: &mut Tracked) -> bool {
    if !t.has_pending() {
        return true;
    }
    let ev = StreamEvent::Delta {
        text: std::mem::take(&mut t.pending_text),
        tokens: std::mem::take(&mut t.pending_tokens),
    };
    match t.tx.try_send(ev) {
        Ok(()) => true,
        Err(TrySendError::Full(StreamEvent::Delta { text, tokens })) => {
            // Slow reader: keep the text (and count) and merge it into the next delta.
            t.pending_text = text;
            t.pending_tokens = tokens;
            true
        }
        Err(TrySendError::Full(_)) => unreachable!("only deltas are flushed"),
        Err(TrySendError::Closed(_)) => false,
    }
}

/// Delivers a request's last events. They must not be lost, so when the channel is full they
/// wait for room on a task of their own instead of blocking the scheduler.
fn send_terminal(tx: mpsc::Sender<StreamEvent>, events: Vec<StreamEvent>) {
    let mut events = events.into_iter();
    for ev in events.by_ref() {
        match tx.try_send(ev) {
            Ok(()) => continue,
            Err(TrySendError::Closed(_)) => return,
            Err(TrySendError::Full(ev)) => {
                let rest: Vec<StreamEvent> = std::iter::once(ev).chain(events).collect();
                actix::spawn(async move {
                    for ev in rest {
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                });
                return;
            }
        }
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;
}

impl Handler<Submit> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        let prompt_tokens = msg.prompt_token_ids.len();
        if let Some(err) = self.admission_error(prompt_tokens) {
            return self.reject(&msg.tx, err);
        }
        let output = match &self.tokenizer {
            Some(tok) => Some(RequestOutput::new(
                tok,
                &msg.prompt_token_ids,
                &msg.params.stop,
            )),
            None if !msg.params.stop.is_empty() => {
                let err = EngineError::invalid(
                    "stop strings need a tokenizer; this engine (a synthetic model) has none",
                );
                return self.reject(&msg.tx, err);
            }
            None => None,
        };
        let params = Arc::new(msg.params);
        let seed = params.seed.unwrap_or_else(rand::random);
        let admission = self.core.add_request(
            NewRequest {
                id: msg.id,
                prompt_token_ids: msg.prompt_token_ids,
                params,
                seed,
                eos_token_ids: self.limits.eos_token_ids.clone(),
            },
            self.secs(msg.arrival),
        );
        match admission {
            Admission::Accepted => {}
            Admission::Overloaded { .. } => {
                self.sync_scheduler_metrics();
                let err = admission.to_error().expect("overloaded maps to an error");
                return self.reject(&msg.tx, err);
            }
            Admission::Duplicate => {
                let err = EngineError::Internal(format!("request id {} reused", msg.id));
                return self.reject(&msg.tx, err);
            }
        }
        self.metrics.prompt_tokens.inc_by(prompt_tokens as u64);
        let _ = msg.tx.try_send(StreamEvent::Started { prompt_tokens });
        self.requests.insert(
            msg.id,
            Tracked {
                tx: msg.tx,
                output,
                pending_text: String::new(),
                pending_tokens: 0,
                prompt_tokens,
                completion_tokens: 0,
                arrival: msg.arrival,
                scheduled_at: None,
                first_token_at: None,
                last_token_at: None,
            },
        );
        self.maybe_step(ctx);
    }
}

impl Handler<Cancel> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Cancel, _ctx: &mut Context<Self>) {
        if let Some(t) = self.requests.remove(&msg.id) {
            self.core.abort_request(msg.id, &mut self.kv.lock());
            self.finish(t, FinishReason::Cancelled, Instant::now());
            self.update_gauges();
        }
    }
}

impl Handler<Abort> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Abort, _ctx: &mut Context<Self>) {
        let mut kv = self.kv.lock();
        for id in msg.ids {
            if self.requests.remove(&id).is_some() {
                self.core.abort_request(id, &mut kv);
            }
        }
        drop(kv);
        self.update_gauges();
    }
}
