//! Per-request output state and the events sent to sessions (see the module docs of `output`).

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{self, error::TrySendError};

use super::backlog::{delta_bytes, Backlog};
use super::text::TextOutput;
use crate::error::EngineError;
use crate::metrics::Metrics;
use crate::request::{FinishReason, RequestId, StreamEvent, Timing, TokenLogprobs, Usage};
use crate::step::RequestUpdate;
use crate::tokenizer::Tokenizer;
use crate::validation::ValidRequest;

/// One request's stream and what is known about it beside the core. A request with `n`
/// choices has one per choice (ids `first .. first + n`), all on the request's channel.
struct RequestState {
    tx: mpsc::Sender<StreamEvent>,
    /// The request's first id (its choice 0) and this choice's index.
    first: RequestId,
    index: usize,
    /// Its socket's unread output, when it has one (a WebSocket session's requests); the
    /// choices of one request share it.
    backlog: Option<Arc<Backlog>>,
    /// Detokenizer and stop strings; `None` on an engine without a tokenizer (counts only).
    text: Option<TextOutput>,
    /// Text (and its token count) not sent yet: the reader was slow, or it is this step's.
    pending_text: String,
    pending_tokens: usize,
    /// Log-probabilities of the pending tokens (requests that asked; else stays empty).
    pending_logprobs: Vec<TokenLogprobs>,
    prompt_tokens: usize,
    completion_tokens: usize,
    arrival: Instant,
    scheduled_at: Option<Instant>,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

impl RequestState {
    /// Whether a delta is due: text to send, or, with no text to wait for, tokens to count.
    /// Log-probabilities wait with their tokens' text, except at the end (`finish`), where a
    /// token without text (eos) still gets its entry.
    fn has_pending(&self) -> bool {
        !self.pending_text.is_empty() || (self.text.is_none() && self.pending_tokens > 0)
    }

    /// New text and log-probabilities for the client; true when they pushed the socket's
    /// unread output past its limit.
    fn push_output(&mut self, text: &str, logprobs: &[TokenLogprobs]) -> bool {
        self.pending_text.push_str(text);
        self.pending_logprobs.extend(logprobs.iter().cloned());
        self.backlog
            .as_ref()
            .is_some_and(|b| b.produced(delta_bytes(text, logprobs)))
    }

    /// The request leaves without its pending output being sent: the socket will never take it.
    fn discard_pending(&self) {
        if let Some(b) = &self.backlog {
            b.taken(delta_bytes(&self.pending_text, &self.pending_logprobs));
        }
    }

    fn take_delta(&mut self) -> StreamEvent {
        StreamEvent::Delta {
            index: self.index,
            text: std::mem::take(&mut self.pending_text),
            tokens: std::mem::take(&mut self.pending_tokens),
            logprobs: std::mem::take(&mut self.pending_logprobs),
        }
    }
}

/// Terminal events that found their channel full: the caller delivers them on a task of their
/// own ([`BlockedTerminal::deliver`]), so they are never lost and the engine never waits.
#[derive(Debug)]
pub struct BlockedTerminal {
    pub tx: mpsc::Sender<StreamEvent>,
    pub events: Vec<StreamEvent>,
}

impl BlockedTerminal {
    pub async fn deliver(self) {
        for ev in self.events {
            if self.tx.send(ev).await.is_err() {
                return;
            }
        }
    }
}

/// What the caller must do after a step's outputs were processed.
#[derive(Debug, Default)]
pub struct Processed {
    /// A stop string completed: the core must finish these (`stop`); their events are sent.
    pub stopped: Vec<RequestId>,
    /// The core must drop these and free their blocks: the channel closed, the client
    /// cancelled or went away, or the step failed.
    pub aborted: Vec<RequestId>,
    /// Terminal events waiting for room in their channel.
    pub blocked: Vec<BlockedTerminal>,
}

pub struct OutputProcessor {
    tokenizer: Option<Arc<Tokenizer>>,
    metrics: Arc<Metrics>,
    requests: HashMap<RequestId, RequestState>,
    /// Requests with `n > 1`, by first id.
    groups: HashMap<RequestId, Group>,
}

/// The choices of an `n > 1` request: one terminal `Done` when the last one ends, its usage
/// counting them all; the others end with `ChoiceDone`.
struct Group {
    n: usize,
    left: usize,
    completion_tokens: usize,
    first_token_at: Option<Instant>,
    scheduled_at: Option<Instant>,
    /// Ended choices' last events that found the channel full: they go before the `Done`.
    held: Vec<StreamEvent>,
}

impl OutputProcessor {
    /// Without a tokenizer, deltas carry token counts and no text.
    pub fn new(tokenizer: Option<Arc<Tokenizer>>, metrics: Arc<Metrics>) -> Self {
        OutputProcessor {
            tokenizer,
            metrics,
            requests: HashMap::new(),
            groups: HashMap::new(),
        }
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.requests.contains_key(&id)
    }

    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Refuses a request that never got in: its only event. A fresh channel has room for it.
    pub fn reject(tx: &mpsc::Sender<StreamEvent>, err: EngineError) {
        let _ = tx.try_send(StreamEvent::Error(err));
    }

    /// The text side of a new request (before the core takes its prompt); `None` without a
    /// tokenizer.
    pub fn text_output(&self, req: &ValidRequest) -> Option<TextOutput> {
        let p = req.params();
        (self.tokenizer.as_ref())
            .map(|tok| TextOutput::new(tok, req.prompt_token_ids(), &p.stop, p.min_tokens))
    }

    /// A request the core accepted, with its `n` choices (ids `id .. id + n`): tracks them and
    /// sends `Started`. `text` comes from [`OutputProcessor::text_output`]; `backlog` is its
    /// socket's unread output, if any.
    #[allow(clippy::too_many_arguments)] // one request's ids, size, text state and sinks
    pub fn add_request(
        &mut self,
        id: RequestId,
        n: usize,
        prompt_tokens: usize,
        text: Option<TextOutput>,
        tx: mpsc::Sender<StreamEvent>,
        backlog: Option<Arc<Backlog>>,
        arrival: Instant,
    ) {
        self.metrics.prompt_tokens.inc_by(prompt_tokens as u64);
        // A fresh channel has room for at least two events (server.stream_buffer >= 2).
        let _ = tx.try_send(StreamEvent::Started { prompt_tokens });
        if n > 1 {
            self.groups.insert(
                id,
                Group {
                    n,
                    left: n,
                    completion_tokens: 0,
                    first_token_at: None,
                    scheduled_at: None,
                    held: Vec::new(),
                },
            );
        }
        // Choice `index`; the choices share the request's channel, socket and text state.
        let choice = |index| RequestState {
            tx: tx.clone(),
            first: id,
            index,
            backlog: backlog.clone(),
            text: text.clone(),
            pending_text: String::new(),
            pending_tokens: 0,
            pending_logprobs: Vec::new(),
            prompt_tokens,
            completion_tokens: 0,
            arrival,
            scheduled_at: None,
            first_token_at: None,
            last_token_at: None,
        };
        // Validation makes n >= 1; choice 0 is tracked whatever n says.
        for index in 0..n.max(1) {
            self.requests
                .insert(RequestId(id.0 + index as u64), choice(index));
        }
    }

    /// Requests in a batch for the first time: their queueing ends at `now`.
    pub fn scheduled(&mut self, ids: &[RequestId], now: Instant) {
        for id in ids {
            if let Some(r) = self.requests.get_mut(id) {
                r.scheduled_at.get_or_insert(now);
            }
        }
    }

    /// Folds one step's updates (tokens came back at `now`) into text, timing and events.
    /// `suspend_non_core` (emergency mode) skips the per-token ITL histogram.
    pub fn process(
        &mut self,
        updates: &[RequestUpdate],
        now: Instant,
        suspend_non_core: bool,
    ) -> Processed {
        let mut done = Processed::default();
        let mut over_limit: Vec<Arc<Backlog>> = Vec::new();
        for u in updates {
            let Some(r) = self.requests.get_mut(&u.id) else {
                continue; // cancelled or aborted while the step ran
            };
            // Text first: a stop string can end the output before the step's last token.
            let mut n = u.new_token_ids.len();
            let mut by_stop_string = false;
            let mut new_text = None;
            if let (Some(text), Some(tok)) = (&mut r.text, &self.tokenizer) {
                let out = text.push_tokens(tok, &u.new_token_ids);
                n = out.tokens_used;
                by_stop_string = out.stopped_by_string;
                new_text = Some(out.text);
                if u.finished.is_some() && !by_stop_string {
                    // Text held back (a partial stop string, an incomplete character) goes
                    // out now; it may still complete a stop string.
                    new_text.get_or_insert_default().push_str(&text.finish(tok));
                    by_stop_string = text.is_stopped();
                }
            }
            if n > 0 {
                match r.last_token_at {
                    None => self.metrics.ttft.observe(secs(now - r.arrival)),
                    Some(last) if !suspend_non_core => {
                        let per_token = secs(now - last) / n as f64;
                        for _ in 0..n {
                            self.metrics.itl.observe(per_token);
                        }
                    }
                    Some(_) => {}
                }
                r.first_token_at.get_or_insert(now);
                r.last_token_at = Some(now);
                r.completion_tokens += n;
                r.pending_tokens += n;
                self.metrics.generation_tokens.inc_by(n as u64);
            }
            let logprobs = &u.logprobs[..n.min(u.logprobs.len())];
            let tripped = r.push_output(new_text.as_deref().unwrap_or(""), logprobs);
            if tripped {
                over_limit.extend(r.backlog.clone());
            }
            let reason = if by_stop_string {
                // The core has not finished it unless its own reason came in the same step.
                if u.finished.is_none() {
                    done.stopped.push(u.id);
                }
                Some(FinishReason::Stop)
            } else {
                u.finished
            };
            match reason {
                Some(reason) => self.finish(u.id, reason, now, &mut done),
                None => {
                    if !flush(r) {
                        r.discard_pending();
                        self.requests.remove(&u.id);
                        done.aborted.push(u.id);
                    }
                }
            }
        }
        for b in over_limit {
            self.fail_slow_consumer(&b, &mut done);
        }
        done
    }

    /// A socket passed its unread-output limit: every request of it ends with `slow_consumer`
    /// (its session closes the socket when it gets to run; see `output::backlog`).
    fn fail_slow_consumer(&mut self, backlog: &Arc<Backlog>, done: &mut Processed) {
        let ids: Vec<RequestId> = (self.requests.iter())
            .filter(|(_, r)| r.backlog.as_ref().is_some_and(|b| Arc::ptr_eq(b, backlog)))
            .map(|(&id, _)| id)
            .collect();
        let unread_bytes = backlog.bytes();
        self.metrics.slow_consumers.inc();
        tracing::warn!(
            requests = ids.len(),
            unread_bytes,
            "slow consumer: cancelling a socket's requests"
        );
        // Failing one choice ends its siblings too; their ids are then gone (ignored).
        for id in ids {
            let err = EngineError::SlowConsumer {
                unread_bytes,
                limit: backlog.limit(),
            };
            self.fail(id, err, done);
        }
    }

    /// Every request tracked, each choice's id (the caller fails them all: a stalled engine, a
    /// drain's deadline; failing one choice ends its siblings, later ids are ignored).
    pub fn ids(&self) -> Vec<RequestId> {
        self.requests.keys().copied().collect()
    }

    /// The ids of `id`'s request still tracked: its choices (`id` is the first one).
    fn choices(&self, id: RequestId) -> Vec<RequestId> {
        let n = self.groups.get(&id).map_or(1, |g| g.n);
        (0..n as u64)
            .map(|i| RequestId(id.0 + i))
            .filter(|c| self.requests.contains_key(c))
            .collect()
    }

    /// The client cancelled (`id`: the request's first id): each choice's held text, then
    /// `done` / `cancelled`. Unknown ids (finished already) are ignored.
    pub fn cancel(&mut self, id: RequestId, now: Instant, done: &mut Processed) {
        for c in self.choices(id) {
            self.cancel_one(c, now, done);
        }
    }

    fn cancel_one(&mut self, id: RequestId, now: Instant, done: &mut Processed) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        if let (Some(text), Some(tok)) = (&mut r.text, &self.tokenizer) {
            let rest = text.finish(tok);
            // Past the limit or not, the socket asked for this: its cancel is served.
            let _ = r.push_output(&rest, &[]);
        }
        self.finish(id, FinishReason::Cancelled, now, done);
        done.aborted.push(id);
    }

    /// The client went away (`id`: the request's first id): forget it, all its choices, no
    /// events.
    pub fn abort(&mut self, id: RequestId, done: &mut Processed) {
        let mut backlog = None;
        for c in self.choices(id) {
            let r = self.requests.remove(&c).expect("listed");
            r.discard_pending();
            backlog = r.backlog;
            done.aborted.push(c);
        }
        // Ended choices' held text will not be sent either.
        if let (Some(g), Some(b)) = (self.groups.remove(&id), backlog) {
            for ev in g.held {
                if let StreamEvent::Delta { text, logprobs, .. } = ev {
                    b.taken(delta_bytes(&text, &logprobs));
                }
            }
        }
    }

    /// The engine failed a request (any of its choices' ids): text so far is dropped, `err` is
    /// its terminal event, and its other choices end with it.
    pub fn fail(&mut self, id: RequestId, err: EngineError, done: &mut Processed) {
        let Some(first) = self.requests.get(&id).map(|r| r.first) else {
            return;
        };
        let mut tx = None;
        for c in self.choices(first) {
            let r = self.requests.remove(&c).expect("listed");
            r.discard_pending();
            tx = Some(r.tx);
            done.aborted.push(c);
        }
        let held = self.groups.remove(&first).map_or(Vec::new(), |g| g.held);
        if let Some(tx) = tx {
            let events = held.into_iter().chain([StreamEvent::Error(err)]).collect();
            send_terminal(tx, events, done);
        }
    }

    fn finish(&mut self, id: RequestId, reason: FinishReason, now: Instant, done: &mut Processed) {
        let Some(mut r) = self.requests.remove(&id) else {
            return;
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let timing = Timing {
            queue_ms: ms(r.scheduled_at.unwrap_or(now) - r.arrival),
            ttft_ms: r.first_token_at.map(|t| ms(t - r.arrival)),
            total_ms: ms(now - r.arrival),
        };
        let m = &self.metrics;
        m.requests_finished
            .with_label_values(&[reason.as_str()])
            .inc();
        m.e2e_latency.observe(timing.total_ms / 1e3);
        if let Some(s) = r.scheduled_at {
            m.queue_time.observe(secs(s - r.arrival));
        }
        let mut events = Vec::with_capacity(2);
        // Tokens without text (eos, special tokens) still end in a delta, so that the deltas'
        // counts add up to the usage.
        if !r.pending_text.is_empty() || r.pending_tokens > 0 || !r.pending_logprobs.is_empty() {
            events.push(r.take_delta());
        }
        let Some(g) = self.groups.get_mut(&r.first) else {
            events.push(StreamEvent::Done {
                index: r.index,
                finish_reason: reason,
                usage: Usage {
                    prompt_tokens: r.prompt_tokens,
                    completion_tokens: r.completion_tokens,
                },
                timing,
            });
            return send_terminal(r.tx, events, done);
        };
        g.left -= 1;
        g.completion_tokens += r.completion_tokens;
        g.first_token_at = earliest(g.first_token_at, r.first_token_at);
        g.scheduled_at = earliest(g.scheduled_at, r.scheduled_at);
        if g.left > 0 {
            // Another choice still runs: this one's end is not the request's.
            events.push(StreamEvent::ChoiceDone {
                index: r.index,
                finish_reason: reason,
                completion_tokens: r.completion_tokens,
            });
            if g.held.is_empty() {
                let mut rest = events.into_iter();
                for ev in rest.by_ref() {
                    if let Err(e) = r.tx.try_send(ev) {
                        if let TrySendError::Full(ev) = e {
                            g.held.push(ev);
                        }
                        break;
                    }
                }
                g.held.extend(rest);
            } else {
                g.held.extend(events);
            }
            return;
        }
        let g = self.groups.remove(&r.first).expect("found above");
        // The request's queueing ended when its first choice was scheduled (the others fork
        // from it later).
        let timing = Timing {
            queue_ms: ms(g.scheduled_at.unwrap_or(now) - r.arrival),
            ttft_ms: g.first_token_at.map(|t| ms(t - r.arrival)),
            ..timing
        };
        let mut all = g.held;
        all.extend(events);
        all.push(StreamEvent::Done {
            index: r.index,
            finish_reason: reason,
            usage: Usage {
                prompt_tokens: r.prompt_tokens,
                completion_tokens: g.completion_tokens,
            },
            timing,
        });
        send_terminal(r.tx, all, done);
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Sends the pending delta if the channel has room. False when the channel is closed.
fn flush(r: &mut RequestState) -> bool {
    if !r.has_pending() {
        return true;
    }
    let delta = r.take_delta();
    match r.tx.try_send(delta) {
        Ok(()) => true,
        Err(TrySendError::Full(StreamEvent::Delta {
            text,
            tokens,
            logprobs,
            ..
        })) => {
            // Slow reader: keep the text (and count) and merge it into the next delta.
            r.pending_text = text;
            r.pending_tokens = tokens;
            r.pending_logprobs = logprobs;
            true
        }
        Err(TrySendError::Full(_)) => unreachable!("only deltas are flushed"),
        Err(TrySendError::Closed(_)) => false,
    }
}

/// Sends a request's last events; what does not fit goes to `done.blocked`.
fn send_terminal(tx: mpsc::Sender<StreamEvent>, events: Vec<StreamEvent>, done: &mut Processed) {
    let mut events = events.into_iter();
    while let Some(ev) = events.next() {
        match tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Closed(_)) => return,
            Err(TrySendError::Full(ev)) => {
                let events = std::iter::once(ev).chain(events).collect();
                done.blocked.push(BlockedTerminal { tx, events });
                return;
            }
        }
    }
}
