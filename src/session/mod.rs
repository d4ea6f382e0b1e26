//! One actor per WebSocket (actix-web-actors is confined to this module). It parses and
//! validates frames, submits requests to the scheduler, and turns each request's bounded event
//! stream into JSON frames. Bad input gets an `error` frame and the socket stays open; a frame
//! over the size limit closes it with 1009; closing the socket aborts all of its requests.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, AsyncContext, StreamHandler};
use actix_web::{web, HttpRequest, HttpResponse};
use actix_web_actors::ws;

use crate::engine::EngineHandle;
use crate::error::EngineError;
use crate::protocol::{parse_client_frame, ClientFrame, ServerFrame};
use crate::request::{RequestId, StreamEvent};

const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Session {
    engine: Arc<EngineHandle>,
    /// Client id → engine id, for requests that have not sent their terminal frame yet.
    inflight: HashMap<Arc<str>, RequestId>,
    last_heard: Instant,
}

/// One event of one request, tagged with the client's id.
struct Tagged(Arc<str>, StreamEvent);

impl Session {
    pub fn new(engine: Arc<EngineHandle>) -> Self {
        Session {
            engine,
            inflight: HashMap::new(),
            last_heard: Instant::now(),
        }
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
        let frame = match parse_client_frame(text) {
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
                let prepared = match self.engine.validate(g.into()) {
                    Ok(p) => p,
                    Err(e) => return self.send_error(ctx, Some(&id), &e),
                };
                let (req_id, rx) = self.engine.submit(prepared);
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
        ctx.run_interval(HEARTBEAT_INTERVAL, |act, ctx| {
            if act.last_heard.elapsed() > CLIENT_TIMEOUT {
                ctx.stop();
            } else {
                ctx.ping(b"");
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.engine.metrics.ws_connections.dec();
        let ids: Vec<RequestId> = self.inflight.drain().map(|(_, id)| id).collect();
        if !ids.is_empty() {
            self.engine.abort(ids);
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Session {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        self.last_heard = Instant::now();
        match msg {
            Ok(ws::Message::Text(text)) => self.on_text(&text, ctx),
            Ok(ws::Message::Binary(_)) => {
                let err = EngineError::InvalidJson(
                    "binary frames are not accepted; send JSON text frames".into(),
                );
                self.send_error(ctx, None, &err);
            }
            Ok(ws::Message::Ping(p)) => ctx.pong(&p),
            Ok(ws::Message::Pong(_)) => {}
            Ok(ws::Message::Close(reason)) => {
                ctx.close(reason);
                ctx.stop();
            }
            Ok(ws::Message::Continuation(_)) => {
                let err = EngineError::InvalidJson("fragmented frames are not accepted".into());
                self.send_error(ctx, None, &err);
            }
            Ok(ws::Message::Nop) => {}
            Err(ws::ProtocolError::Overflow) => {
                let limit = self.engine.limits.max_frame_bytes;
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Size,
                    description: Some(format!("frame larger than {limit} bytes")),
                }));
                ctx.stop();
            }
            Err(e) => {
                tracing::debug!("websocket protocol error: {e}");
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Protocol,
                    description: Some(e.to_string()),
                }));
                ctx.stop();
            }
        }
    }
}

impl StreamHandler<Tagged> for Session {
    fn handle(&mut self, Tagged(id, ev): Tagged, ctx: &mut Self::Context) {
        if ev.is_terminal() {
            self.inflight.remove(&id);
        }
        match &ev {
            // Streamed errors take the same exit as the session's own, where they are counted.
            StreamEvent::Error(err) => self.send_error(ctx, Some(&id), err),
            _ => ctx.text(ServerFrame::from_event(&id, &ev).to_json()),
        }
    }

    /// A request's stream ending is normal; only the socket's own stream ends the session.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

/// `GET /v1/ws`: upgrade to a WebSocket served by a new `Session`.
pub async fn ws_route(
    req: HttpRequest,
    stream: web::Payload,
    engine: web::Data<EngineHandle>,
) -> actix_web::Result<HttpResponse> {
    let max_frame = engine.limits.max_frame_bytes;
    let session = Session::new(engine.into_inner());
    ws::WsResponseBuilder::new(session, &req, stream)
        .frame_size(max_frame)
        .start()
}
