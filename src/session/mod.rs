//! One actor per WebSocket (actix-web-actors is confined to this module). Frames come from
//! `reader.rs` (actix-http's codec, size limit applied at each header) through `frames.rs` (RFC
//! 6455 reassembly: fragments, interleaved control frames, whole-message size and UTF-8); whole
//! messages are parsed, rate limited (`limits.rs`) and submitted to the scheduler, and each
//! request's bounded event stream becomes JSON frames. Bad JSON or a bad request gets an `error`
//! frame and the socket stays open; a framing violation closes it with the code `close.rs` gives;
//! closing the socket aborts all of its requests.
//!
//! Slow consumers: output the socket has not taken is counted in its `Backlog` (see
//! `output::backlog` for why there and not at the socket); past `server.max_unread_bytes` its
//! requests end with `slow_consumer`, the session closes with 1008 once their error frames are
//! out, and `socket.rs`'s watchdog cuts the connection if the session stays frozen.
//! Draining (SIGTERM): the session closes with 1001 once its requests have ended.

pub mod close;
pub mod frames;
pub mod limits;
pub mod reader;
pub mod socket;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, StreamHandler, WrapFuture};
use actix_web::{web, HttpRequest, HttpResponse};
use actix_web_actors::ws;

use crate::engine::EngineHandle;
use crate::error::EngineError;
use crate::output::{delta_bytes, Backlog};
use crate::protocol::{parse_client_frame, ClientFrame, ServerFrame};
use crate::request::{RequestId, StreamEvent};
use close::CloseWhy;
use frames::{Reassembler, Step};
use limits::{ConnectionSlot, EdgeLimits, TokenBucket};
use reader::{FrameReader, ReadError};
use socket::{ConnSocket, Watchdog};

/// The subprotocol the server answers with when a client offers it (browsers offer it next to
/// `bearer.<key>` to authenticate).
pub const SUBPROTOCOL: &str = "brook";

pub struct Session {
    engine: Arc<EngineHandle>,
    limits: Arc<EdgeLimits>,
    /// Client id → engine id, for requests that have not sent their terminal frame yet.
    inflight: HashMap<Arc<str>, RequestId>,
    reassembler: Reassembler,
    bucket: Option<TokenBucket>,
    /// Messages refused by the rate limit since the last one accepted.
    refused_in_row: u32,
    last_heard: Instant,
    /// Output produced for this socket's requests that it has not taken yet.
    backlog: Arc<Backlog>,
    /// The connection, for the watchdog's cut (absent when not over TCP).
    conn: Option<ConnSocket>,
    watchdog: Option<Watchdog>,
    /// The server is draining: close once no request is in flight.
    draining: bool,
    /// Held for the connection's life: the server-wide connection count.
    _slot: ConnectionSlot,
}

/// One event of one request, tagged with the client's id.
struct Tagged(Arc<str>, StreamEvent);

/// `GET /v1/ws` after the edge's checks (server/edge.rs): the handshake, then a `Session` reads
/// the socket through a `FrameReader`.
pub fn start(
    req: &HttpRequest,
    payload: web::Payload,
    engine: Arc<EngineHandle>,
    limits: Arc<EdgeLimits>,
    slot: ConnectionSlot,
) -> actix_web::Result<HttpResponse> {
    let mut resp = match ws::handshake_with_protocols(req, &[SUBPROTOCOL]) {
        Ok(resp) => resp,
        // Not a WebSocket upgrade (a plain GET, a missing header): its status, with a body
        // that says so, as every other refusal has.
        Err(e) => {
            let status = actix_web::ResponseError::error_response(&e).status();
            return Ok(HttpResponse::build(status).json(serde_json::json!({
                "error": "websocket_handshake",
                "message": format!("{e}: /v1/ws takes a WebSocket upgrade (docs/PROTOCOL.md)"),
            })));
        }
    };
    let frames = FrameReader::new(payload, limits.max_message_bytes);
    let mut session = Session::new(engine, limits, slot);
    session.conn = req.conn_data::<ConnSocket>().copied();
    // The context's built-in reader gets a stream that never yields: ours reads the socket.
    let idle =
        futures_util::stream::pending::<Result<web::Bytes, actix_web::error::PayloadError>>();
    let body = ws::WebsocketContext::with_factory(idle, move |ctx| {
        ctx.add_stream(frames);
        session
    });
    Ok(resp.streaming(body))
}

impl Session {
    pub fn new(engine: Arc<EngineHandle>, limits: Arc<EdgeLimits>, slot: ConnectionSlot) -> Self {
        let now = Instant::now();
        let unread = engine.metrics.ws_unread_bytes.clone();
        Session {
            backlog: Backlog::new(limits.max_unread_bytes, unread),
            conn: None,
            watchdog: None,
            draining: false,
            engine,
            reassembler: Reassembler::new(limits.max_message_bytes),
            bucket: limits.rate.as_ref().map(|r| TokenBucket::new(r, now)),
            limits,
            inflight: HashMap::new(),
            refused_in_row: 0,
            last_heard: now,
            _slot: slot,
        }
    }

    /// Fails the connection (RFC 6455 §7.1.7): the close frame, then the end.
    fn close(&self, ctx: &mut ws::WebsocketContext<Self>, why: CloseWhy) {
        tracing::debug!("closing websocket: {why:?}");
        self.engine
            .metrics
            .ws_closes
            .with_label_values(&[why.label()])
            .inc();
        ctx.close(Some(why.reason()));
        ctx.stop();
    }

    /// The rate limit, charged per message before it does any work; `Err` when refused (the
    /// caller has already been told, or the socket is closing).
    fn charge(&mut self, ctx: &mut ws::WebsocketContext<Self>, id: Option<&str>) -> Result<(), ()> {
        let Some(bucket) = self.bucket.as_mut() else {
            return Ok(());
        };
        match bucket.take(Instant::now()) {
            Ok(()) => {
                self.refused_in_row = 0;
                Ok(())
            }
            Err(wait) => {
                self.refused_in_row += 1;
                let close_after = self.limits.rate.map_or(0, |r| r.close_after);
                if close_after > 0 && self.refused_in_row >= close_after {
                    let refused = self.refused_in_row;
                    self.close(ctx, CloseWhy::RateLimit { refused });
                } else {
                    let retry_after_ms = (wait.as_secs_f64() * 1000.0).ceil().max(1.0) as u64;
                    self.send_error(ctx, id, &EngineError::RateLimited { retry_after_ms });
                }
                Err(())
            }
        }
    }

    /// Ends the socket when the client sent nothing for the idle timeout; re-arms itself for
    /// the rest of the timeout otherwise (one timer, no polling).
    fn watch_idle(&self, ctx: &mut ws::WebsocketContext<Self>, after: Duration) {
        ctx.run_later(after, |act, ctx| {
            let Some(idle) = act.limits.idle_timeout else {
                return;
            };
            let quiet = act.last_heard.elapsed();
            if quiet >= idle {
                let secs = idle.as_secs();
                act.close(ctx, CloseWhy::Idle { secs });
            } else {
                act.watch_idle(ctx, idle - quiet);
            }
        });
    }

    fn send_error(
        &self,
        ctx: &mut ws::WebsocketContext<Self>,
        id: Option<&str>,
        err: &EngineError,
    ) {
        self.engine.metrics.count_error(err);
        ctx.text(ServerFrame::error(id, err).to_json());
    }

    fn on_text(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        let parsed = parse_client_frame(text);
        // Cancelling a request in flight creates no work, so it is never refused.
        let free = matches!(&parsed, Ok(ClientFrame::Cancel { id }) if self.inflight.contains_key(id.as_str()));
        if !free {
            let id = match &parsed {
                Ok(ClientFrame::Generate(g)) => Some(g.id.as_str()),
                Ok(ClientFrame::Cancel { id }) => Some(id.as_str()),
                Err(e) => e.id.as_deref(),
            };
            if self.charge(ctx, id).is_err() {
                return;
            }
        }
        let frame = match parsed {
            Ok(f) => f,
            Err(e) => return self.send_error(ctx, e.id.as_deref(), &e.error),
        };
        match frame {
            ClientFrame::Generate(g) => {
                if self.inflight.contains_key(g.id.as_str()) {
                    let err = EngineError::DuplicateId(g.id.clone());
                    return self.send_error(ctx, Some(&g.id), &err);
                }
                if self.inflight.len() >= self.engine.limits.max_requests_per_connection {
                    let err = EngineError::Overloaded {
                        reason: format!(
                            "{} requests already in flight on this connection",
                            self.inflight.len()
                        ),
                        retry_after_ms: 100,
                    };
                    return self.send_error(ctx, Some(&g.id), &err);
                }
                let id: Arc<str> = Arc::from(g.id.as_str());
                let prepared = match self.engine.validate((*g).into()) {
                    Ok(p) => p,
                    Err(e) => return self.send_error(ctx, Some(&id), &e),
                };
                let (req_id, rx) = self
                    .engine
                    .submit_from(prepared, Some(self.backlog.clone()));
                self.inflight.insert(id.clone(), req_id);
                let events = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|ev| (ev, rx))
                });
                let tagged = futures_util::StreamExt::map(events, move |ev| Tagged(id.clone(), ev));
                ctx.add_stream(tagged);
            }
            ClientFrame::Cancel { id } => match self.inflight.get(id.as_str()) {
                Some(&req_id) => self.engine.cancel(req_id),
                None => {
                    let err = EngineError::UnknownId(id.clone());
                    self.send_error(ctx, Some(&id), &err);
                }
            },
        }
    }
}

impl Actor for Session {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.engine.metrics.ws_connections.inc();
        if !self.engine.scheduler.connected() {
            return self.close(ctx, CloseWhy::Internal("the engine is not running".into()));
        }
        self.watchdog = Some(Watchdog::start(
            self.backlog.clone(),
            self.limits.slow_consumer_grace,
            self.conn,
            self.engine.metrics.clone(),
        ));
        let mut drain = self.engine.health.subscribe_drain();
        let draining = async move { drain.wait_for(|d| *d).await.is_ok() };
        ctx.spawn(draining.into_actor(self).map(|draining, act, ctx| {
            if draining {
                act.draining = true;
                act.close_if_done(ctx);
            }
        }));
        if let Some(every) = self.limits.ping_interval {
            ctx.run_interval(every, |_, ctx| ctx.ping(b""));
        }
        if let Some(idle) = self.limits.idle_timeout {
            self.watch_idle(ctx, idle);
        }
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.engine.metrics.ws_connections.dec();
        let ids: Vec<RequestId> = self.inflight.drain().map(|(_, id)| id).collect();
        if !ids.is_empty() {
            self.engine.abort(ids);
        }
    }
}

impl Session {
    /// Closes a draining or over-limit socket once its last request has sent its terminal frame.
    fn close_if_done(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        if !self.inflight.is_empty() {
            return;
        }
        if self.backlog.is_tripped() {
            let limit = self.backlog.limit();
            self.close(ctx, CloseWhy::SlowConsumer { limit });
        } else if self.draining {
            self.close(ctx, CloseWhy::ShuttingDown);
        }
    }
}

/// The socket's frames, from our `FrameReader`.
impl StreamHandler<Result<ws::Frame, ReadError>> for Session {
    fn handle(&mut self, item: Result<ws::Frame, ReadError>, ctx: &mut Self::Context) {
        self.last_heard = Instant::now();
        let frame = match item {
            Ok(f) => f,
            Err(ReadError::TooBig { .. }) => {
                let limit = self.limits.max_message_bytes;
                return self.close(ctx, CloseWhy::TooBig { limit });
            }
            Err(ReadError::Protocol(e)) => {
                return self.close(ctx, CloseWhy::Protocol(e.to_string()))
            }
            Err(ReadError::Io(e)) => {
                // The connection is gone; no close frame can reach the client.
                tracing::debug!("websocket read failed: {e}");
                return ctx.stop();
            }
        };
        match self.reassembler.push(frame) {
            Step::Pending | Step::Pong => {}
            Step::Message(text) => self.on_text(&text, ctx),
            Step::Ping(p) => ctx.pong(&p),
            Step::Close(reason) => {
                // The close handshake: echo the client's code, then stop (RFC 6455 §5.5.1).
                self.engine
                    .metrics
                    .ws_closes
                    .with_label_values(&["client"])
                    .inc();
                ctx.close(reason.map(|r| ws::CloseReason::from(r.code)));
                ctx.stop();
            }
            Step::Fail(why) => self.close(ctx, why),
        }
    }
}

/// Required by `WebsocketContext`, whose own reader is given a stream that never yields (see
/// `start`): frames arrive through the handler above.
impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Session {
    fn handle(&mut self, _: Result<ws::Message, ws::ProtocolError>, _: &mut Self::Context) {}
}

impl StreamHandler<Tagged> for Session {
    fn handle(&mut self, Tagged(id, ev): Tagged, ctx: &mut Self::Context) {
        match &ev {
            // Streamed errors take the same exit as the session's own, where they are counted.
            StreamEvent::Error(err) => self.send_error(ctx, Some(&id), err),
            ev => {
                if let StreamEvent::Delta { text, logprobs, .. } = ev {
                    self.backlog.taken(delta_bytes(text, logprobs));
                }
                let tok = Some(&*self.engine.tokenizer);
                ctx.text(ServerFrame::from_event(&id, ev, tok).to_json());
            }
        }
        if ev.is_terminal() {
            self.inflight.remove(&id);
            self.close_if_done(ctx);
        }
    }

    /// A request's stream ending is normal; only the socket's own stream ends the session.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}
