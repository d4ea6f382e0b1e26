//! The live dashboard's push stream: `GET /v1/dashboard/stream`, Server-Sent Events.
//!
//! One producer per server computes a snapshot once per second from the shared metrics
//! (`Metrics::snapshot` → `snapshot::compute`) and fans it out, encoded once, over a
//! `tokio::sync::broadcast` ring of `FANOUT_CAPACITY` events. A subscriber that reads slower
//! than that skips the oldest snapshots (counted in `fanout.dropped`): memory stays fixed
//! whatever the clients do, and the producer never waits on one. The engine is never asked
//! anything: the producer only reads metrics the scheduler already keeps.
//!
//! Events: `hello` first (engine info, the recent chart points, the latest snapshot), then
//! `snapshot` every second. Format in docs/PROTOCOL.md.

pub mod snapshot;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::web::{self, Bytes};
use actix_web::HttpResponse;
use futures_util::Stream;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::engine::EngineHandle;
use crate::metrics::Metrics;
use snapshot::{ChartPoint, DashboardSnapshot, Fanout, Window};

/// Snapshot period.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Events a subscriber may fall behind before it skips the oldest.
pub const FANOUT_CAPACITY: usize = 4;
/// Chart points a new subscriber gets at once (5 minutes at 1 Hz).
pub const HISTORY_POINTS: usize = 300;

/// Static facts about the served engine, sent in `hello`.
#[derive(Debug, Clone, Serialize)]
pub struct EngineFacts {
    pub model: String,
    pub device: String,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub kv_block_size: usize,
    pub kv_blocks: usize,
}

#[derive(Serialize)]
struct Hello<'a> {
    engine: &'a EngineFacts,
    interval_s: f64,
    window_s: f64,
    history: &'a VecDeque<ChartPoint>,
    latest: Option<&'a DashboardSnapshot>,
}

struct State {
    window: Window,
    history: VecDeque<ChartPoint>,
    latest: Option<DashboardSnapshot>,
    seq: u64,
    /// The clock `Window` runs on.
    epoch: Option<Instant>,
}

pub struct Dashboard {
    metrics: Arc<Metrics>,
    facts: EngineFacts,
    /// Ticks send under this lock and subscribers join under it, so a subscriber's `hello`
    /// and its first `snapshot` neither overlap nor leave a gap.
    state: Mutex<State>,
    tx: broadcast::Sender<Bytes>,
    dropped: Arc<AtomicU64>,
}

impl Dashboard {
    pub fn new(metrics: Arc<Metrics>, facts: EngineFacts) -> Self {
        let (tx, _) = broadcast::channel(FANOUT_CAPACITY);
        Dashboard {
            metrics,
            facts,
            state: Mutex::new(State {
                window: Window::default(),
                history: VecDeque::with_capacity(HISTORY_POINTS),
                latest: None,
                seq: 0,
                epoch: None,
            }),
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Creates the dashboard of `engine` and spawns its 1 Hz producer on the current actix
    /// arbiter. The producer stops once the last `Arc` (the server's app data) is gone.
    pub fn start(engine: &EngineHandle) -> Arc<Self> {
        let info = &engine.info;
        let facts = EngineFacts {
            model: info.model_name.clone(),
            device: info.backend.device.clone(),
            max_model_len: info.max_model_len,
            max_num_seqs: info.max_num_seqs,
            max_num_batched_tokens: info.max_num_batched_tokens,
            kv_block_size: info.backend.block_size,
            kv_blocks: info.backend.num_kv_blocks,
        };
        let dash = Arc::new(Dashboard::new(engine.metrics.clone(), facts));
        dash.tick(Instant::now(), SystemTime::now());
        let weak: Weak<Dashboard> = Arc::downgrade(&dash);
        actix_rt::spawn(async move {
            let mut timer =
                tokio::time::interval_at(tokio::time::Instant::now() + INTERVAL, INTERVAL);
            // After a stall, carry on from now rather than firing a burst of catch-up ticks.
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                timer.tick().await;
                let Some(dash) = weak.upgrade() else { return };
                dash.tick(Instant::now(), SystemTime::now());
            }
        });
        dash
    }

    /// Takes one snapshot and sends it to every subscriber. Never blocks on a subscriber.
    pub fn tick(&self, now: Instant, wall: SystemTime) {
        let metrics = self.metrics.snapshot();
        let mut st = self.state.lock();
        let epoch = *st.epoch.get_or_insert(now);
        st.window
            .push(now.saturating_duration_since(epoch).as_secs_f64(), metrics);
        let seq = st.seq;
        st.seq += 1;
        let fanout = Fanout {
            subscribers: self.tx.receiver_count(),
            dropped: self.dropped.load(Ordering::Relaxed),
        };
        let t_ms = wall
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let Some(snap) = snapshot::compute(&st.window, seq, t_ms, fanout) else {
            return;
        };
        if st.history.len() == HISTORY_POINTS {
            st.history.pop_front();
        }
        st.history.push_back(snap.chart.clone());
        // No subscriber is not an error: the snapshot is still kept for the next one.
        let _ = self.tx.send(sse_event("snapshot", Some(seq), &snap));
        st.latest = Some(snap);
    }

    /// Joins the stream: the `hello` event to send first, and the receiver of what follows.
    pub fn subscribe(&self) -> (Bytes, broadcast::Receiver<Bytes>) {
        let st = self.state.lock();
        let hello = Hello {
            engine: &self.facts,
            interval_s: INTERVAL.as_secs_f64(),
            window_s: snapshot::WINDOW_S,
            history: &st.history,
            latest: st.latest.as_ref(),
        };
        (sse_event("hello", None, &hello), self.tx.subscribe())
    }

    /// `hello`, then the snapshots as they come; lagging skips to the oldest still buffered.
    pub fn event_stream(&self) -> impl Stream<Item = Result<Bytes, Infallible>> + 'static {
        let (hello, rx) = self.subscribe();
        let dropped = self.dropped.clone();
        let rest = futures_util::stream::unfold(rx, move |mut rx| {
            let dropped = dropped.clone();
            async move {
                loop {
                    match rx.recv().await {
                        Ok(ev) => return Some((Ok(ev), rx)),
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            dropped.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        });
        futures_util::StreamExt::chain(futures_util::stream::once(async { Ok(hello) }), rest)
    }
}

/// One SSE event; the JSON is on one `data:` line (serde_json never writes a raw newline).
fn sse_event(name: &str, id: Option<u64>, payload: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(payload).expect("dashboard payloads serialize");
    let id = id.map(|i| format!("id: {i}\n")).unwrap_or_default();
    Bytes::from(format!("event: {name}\n{id}data: {json}\n\n"))
}

/// `GET /v1/dashboard/stream`.
pub async fn stream(
    req: actix_web::HttpRequest,
    dash: web::Data<Dashboard>,
    edge: web::Data<super::edge::Edge>,
) -> HttpResponse {
    if let Err(e) = edge.access.check_dashboard(&req) {
        return e.response();
    }
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        // Proxies (nginx) would otherwise buffer the stream.
        .insert_header(("x-accel-buffering", "no"))
        .streaming(dash.event_stream())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn dashboard() -> (Arc<Metrics>, Dashboard) {
        let metrics = Arc::new(Metrics::new());
        let facts = EngineFacts {
            model: "m".into(),
            device: "cpu".into(),
            max_model_len: 1024,
            max_num_seqs: 8,
            max_num_batched_tokens: 256,
            kv_block_size: 16,
            kv_blocks: 100,
        };
        (metrics.clone(), Dashboard::new(metrics, facts))
    }

    fn data_of(ev: &Bytes) -> serde_json::Value {
        let text = std::str::from_utf8(ev).unwrap();
        let line = text.lines().find(|l| l.starts_with("data: ")).unwrap();
        serde_json::from_str(&line["data: ".len()..]).unwrap()
    }

    #[actix_rt::test]
    async fn a_slow_subscriber_skips_snapshots_and_memory_stays_bounded() {
        let (metrics, d) = dashboard();
        let t0 = Instant::now();
        let mut stream = Box::pin(d.event_stream());
        let hello = stream.next().await.unwrap().unwrap();
        assert!(std::str::from_utf8(&hello)
            .unwrap()
            .starts_with("event: hello\n"));
        // The subscriber reads nothing while 100 snapshots go out.
        for i in 0..100u64 {
            metrics.generation_tokens.inc_by(10);
            d.tick(t0 + Duration::from_secs(i), SystemTime::now());
        }
        assert!(d.tx.len() <= FANOUT_CAPACITY, "{}", d.tx.len());
        // It then gets only the newest FANOUT_CAPACITY, in order.
        let mut seqs = Vec::new();
        for _ in 0..FANOUT_CAPACITY {
            let ev = stream.next().await.unwrap().unwrap();
            seqs.push(data_of(&ev)["seq"].as_u64().unwrap());
        }
        assert_eq!(
            seqs,
            (100 - FANOUT_CAPACITY as u64..100).collect::<Vec<_>>()
        );
        assert_eq!(
            d.dropped.load(Ordering::Relaxed),
            100 - FANOUT_CAPACITY as u64
        );
        // The next snapshot reports the drops and the subscriber.
        d.tick(t0 + Duration::from_secs(100), SystemTime::now());
        let ev = data_of(&stream.next().await.unwrap().unwrap());
        assert_eq!(ev["fanout"]["subscribers"], 1);
        assert_eq!(ev["fanout"]["dropped"], 100 - FANOUT_CAPACITY as u64);
        assert_eq!(ev["tokens_per_s"], 0.0);
    }

    #[actix_rt::test]
    async fn hello_carries_bounded_history_and_the_latest_snapshot() {
        let (metrics, d) = dashboard();
        let t0 = Instant::now();
        for i in 0..(HISTORY_POINTS as u64 + 20) {
            metrics.generation_tokens.inc_by(i);
            d.tick(t0 + Duration::from_secs(i), SystemTime::now());
        }
        let (hello, _rx) = d.subscribe();
        let text = std::str::from_utf8(&hello).unwrap();
        assert!(text.starts_with("event: hello\ndata: {"), "{text:.80}");
        assert!(text.ends_with("}\n\n"));
        let j = data_of(&hello);
        assert_eq!(j["history"].as_array().unwrap().len(), HISTORY_POINTS);
        assert_eq!(j["engine"]["kv_blocks"], 100);
        assert_eq!(j["interval_s"], 1.0);
        let latest = &j["latest"];
        assert_eq!(latest["seq"], HISTORY_POINTS as u64 + 19);
        // The last interval generated (HISTORY_POINTS + 19) tokens in one second.
        assert_eq!(latest["tokens_per_s"], (HISTORY_POINTS + 19) as f64);
    }

    #[actix_rt::test]
    async fn a_dropped_dashboard_ends_its_streams() {
        let (_m, d) = dashboard();
        let mut stream = Box::pin(d.event_stream());
        stream.next().await.unwrap().unwrap();
        drop(d);
        assert!(stream.next().await.is_none());
    }
}
