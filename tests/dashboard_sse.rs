//! The dashboard's push stream, `GET /v1/dashboard/stream`, against a real server: SSE format,
//! ~1 Hz, live figures while requests run, and one receiver per open stream (released on
//! disconnect). The slow-subscriber bound is unit-tested in src/server/dashboard/mod.rs.
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// An open event stream, parsed into (event name, id, JSON data) as events complete.
type Body = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>>,
>;

struct Sse {
    body: Body,
    buf: String,
}

struct Event {
    name: String,
    id: Option<u64>,
    data: Value,
    at: Instant,
}

impl Sse {
    async fn open(server: &TestServer) -> Sse {
        let resp = awc::Client::new()
            .get(server.url("/v1/dashboard/stream"))
            .send()
            .await
            .unwrap();
        assert_event_stream(&resp);
        assert_eq!(resp.headers().get("cache-control").unwrap(), "no-cache");
        Sse {
            body: Box::pin(resp),
            buf: String::new(),
        }
    }

    async fn next(&mut self) -> Event {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let raw: String = self.buf.drain(..end + 2).collect();
                return parse_event(&raw);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(5), self.body.next())
                .await
                .expect("an event within 5 s")
                .expect("stream open")
                .unwrap();
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// The next `snapshot` event's data.
    async fn snapshot(&mut self) -> Event {
        let ev = self.next().await;
        assert_eq!(ev.name, "snapshot");
        ev
    }
}

/// One SSE event: `event:` and `id:` lines, then exactly one `data:` line of JSON.
fn parse_event(raw: &str) -> Event {
    let (mut name, mut id, mut data) = (None, None, None);
    for line in raw.trim_end_matches('\n').lines() {
        let (field, value) = line.split_once(": ").expect("field: value");
        match field {
            "event" => name = Some(value.to_owned()),
            "id" => id = Some(value.parse().unwrap()),
            "data" => {
                assert!(data.is_none(), "one data line per event: {raw}");
                data = Some(serde_json::from_str(value).unwrap());
            }
            other => panic!("unexpected field {other} in {raw}"),
        }
    }
    Event {
        name: name.expect("event name"),
        id,
        data: data.expect("data line"),
        at: Instant::now(),
    }
}

#[actix_rt::test]
async fn hello_then_one_snapshot_per_second() {
    let server = start_server(test_config()).await;
    let mut sse = Sse::open(&server).await;
    let hello = sse.next().await;
    assert_eq!(hello.name, "hello");
    assert_eq!(hello.id, None);
    let h = &hello.data;
    assert_eq!(h["interval_s"], 1.0);
    assert_eq!(h["window_s"], 60.0);
    assert!(h["engine"]["kv_blocks"].as_u64().unwrap() > 0);
    assert_eq!(h["engine"]["device"], "cpu");
    assert!(h["history"].is_array());

    let evs = [
        sse.snapshot().await,
        sse.snapshot().await,
        sse.snapshot().await,
    ];
    for pair in evs.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap > Duration::from_millis(600) && gap < Duration::from_millis(1600),
            "snapshots {gap:?} apart"
        );
        assert_eq!(pair[1].id.unwrap(), pair[0].id.unwrap() + 1);
        assert_eq!(
            pair[1].data["seq"],
            pair[0].data["seq"].as_u64().unwrap() + 1
        );
    }
    let s = &evs[2].data;
    let interval = s["interval_s"].as_f64().unwrap();
    assert!((0.6..1.6).contains(&interval), "interval_s {interval}");
    assert_eq!(s["percentiles_from"], "histogram_bucket_deltas");
    assert_eq!(s["tokens_per_s"], 0.0, "idle engine");
    assert_eq!(s["kv_tiers"][0]["name"], "device");
    assert_eq!(s["kv_tiers"][0]["used_blocks"], 0);
    assert!(s["speculative"].is_null());
    assert!(s["chart"]["t"].as_f64().unwrap() > 1.6e9);
    server.stop().await;
}

#[actix_rt::test]
async fn snapshots_show_live_tokens_per_second_and_return_to_idle() {
    let server = start_server(test_config()).await;
    let mut sse = Sse::open(&server).await;
    assert_eq!(sse.next().await.name, "hello");

    // Back-to-back requests until the dashboard has seen them: the test model is fast, so one
    // request alone could fall between two snapshots.
    let running = Arc::new(AtomicBool::new(true));
    let port = server.port;
    let load = {
        let running = running.clone();
        actix_rt::spawn(async move {
            let (_resp, mut ws) = awc::Client::new()
                .ws(format!("ws://127.0.0.1:{port}/v1/ws"))
                .connect()
                .await
                .unwrap();
            let mut n = 0;
            while running.load(Ordering::Relaxed) {
                n += 1;
                let frame = json!({"type":"generate","id":format!("r{n}"),"prompt":"Tell me a long story",
                                   "params":{"max_tokens":400,"ignore_eos":true}});
                futures_util::SinkExt::send(
                    &mut ws,
                    awc::ws::Message::Text(frame.to_string().into()),
                )
                .await
                .unwrap();
                // Wait for this request's terminal frame.
                loop {
                    match ws.next().await {
                        Some(Ok(awc::ws::Frame::Text(t))) => {
                            let f: Value = serde_json::from_slice(&t).unwrap();
                            if f["type"] == "done" || f["type"] == "error" {
                                assert_eq!(f["type"], "done", "{f}");
                                break;
                            }
                        }
                        Some(Ok(_)) => {}
                        other => panic!("socket ended: {other:?}"),
                    }
                }
            }
        })
    };

    let mut saw_rate = None;
    let mut saw_running = false;
    for _ in 0..15 {
        let s = sse.snapshot().await.data;
        saw_running |= s["requests"]["running"].as_i64().unwrap() >= 1;
        if s["tokens_per_s"].as_f64().unwrap() > 0.0 {
            saw_rate = Some(s);
            if saw_running {
                break;
            }
        }
    }
    let s = saw_rate.expect("a snapshot with tokens/s > 0 within 15 s");
    assert!(saw_running, "a snapshot with a running request");
    assert!(s["batch"]["steps_per_s"].as_f64().unwrap() > 0.0, "{s}");
    assert!(
        s["batch"]["step_time_ms"]["count"].as_u64().unwrap() > 0,
        "{s}"
    );
    assert!(s["chart"]["tokens_per_s"].as_f64().unwrap() > 0.0);

    running.store(false, Ordering::Relaxed);
    load.await.unwrap();
    wait_idle(&server).await;
    // Rates are per interval, not cumulative: an idle engine shows 0 again, and the window's
    // percentiles still describe the requests just served.
    let mut idle = None;
    for _ in 0..4 {
        let s = sse.snapshot().await.data;
        if s["tokens_per_s"] == 0.0 && s["requests"]["running"] == 0 {
            idle = Some(s);
            break;
        }
    }
    let s = idle.expect("tokens/s back to 0 once idle");
    assert_eq!(s["kv_tiers"][0]["used_blocks"], 0);
    let ttft = &s["ttft_ms"];
    assert!(ttft["count"].as_u64().unwrap() >= 1, "{s}");
    assert!(ttft["p50"].as_f64().unwrap() <= ttft["p99"].as_f64().unwrap());
    assert!(s["finish_reasons"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["label"] == "length" && r["total"].as_u64().unwrap() >= 1));
    server.stop().await;
}

#[actix_rt::test]
async fn each_open_stream_is_one_subscriber_and_closing_releases_it() {
    let server = start_server(test_config()).await;
    let mut a = Sse::open(&server).await;
    let b = Sse::open(&server).await;
    assert_eq!(a.next().await.name, "hello");
    // Both are counted; the second is never read and holds nothing up.
    let mut counted = false;
    for _ in 0..3 {
        if a.snapshot().await.data["fanout"]["subscribers"] == 2 {
            counted = true;
            break;
        }
    }
    assert!(counted, "two open streams counted as two subscribers");
    drop(b);
    let mut released = false;
    for _ in 0..4 {
        if a.snapshot().await.data["fanout"]["subscribers"] == 1 {
            released = true;
            break;
        }
    }
    assert!(released, "a closed stream's receiver is dropped");
    server.stop().await;
}

#[actix_rt::test]
async fn page_routes_serve_the_app_with_its_csp_and_assets() {
    let server = start_server(test_config()).await;
    let client = awc::Client::new();
    let mut pages = Vec::new();
    for path in ["/", "/dashboard"] {
        let mut resp = client.get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let csp = resp.headers().get("content-security-policy").unwrap();
        assert!(
            csp.to_str().unwrap().contains("script-src 'self'"),
            "{csp:?}"
        );
        pages.push(resp.body().await.unwrap());
    }
    assert_eq!(pages[0], pages[1], "one app, two tabs");
    let mut js = client
        .get(server.url("/static/js/conn.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(js.status(), 200);
    assert!(js
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    let body = js.body().await.unwrap();
    assert!(std::str::from_utf8(&body).unwrap().contains("/v1/ws"));
    let css = client
        .get(server.url("/static/vendor/uplot/uPlot.min.css"))
        .send()
        .await
        .unwrap();
    assert!(css
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    for missing in ["/static/nope.js", "/static/../Cargo.toml", "/static/"] {
        let resp = client.get(server.url(missing)).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{missing}");
    }
    server.stop().await;
}
