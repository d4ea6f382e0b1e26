//! Slow consumers end to end (issue 17): a real client with a small receive buffer that stops
//! reading its socket. Other clients' requests complete meanwhile; once the socket's unread
//! output passes `server.max_unread_bytes` its request ends with `slow_consumer` and its KV is
//! freed; a client that reads again gets the error frame and a close 1008; one that never does
//! has its connection cut after `server.slow_consumer_grace_s`. What the server held for the
//! socket stays bounded throughout.
mod common;

use std::time::{Duration, Instant};

use actix_codec::{Decoder, Encoder};
use actix_http::ws::{Codec, Frame, Message};
use actix_web::web::BytesMut;
use common::testing::TestModelSpec;
use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAX_TOKENS: usize = 4000;
const UNREAD_LIMIT: usize = 1024;

fn config(grace_s: f64) -> brook::config::Config {
    let mut cfg = test_config();
    cfg.cache.kv_cache_mib = 16;
    cfg.server.max_unread_bytes = UNREAD_LIMIT;
    cfg.server.slow_consumer_grace_s = grace_s;
    // A small kernel send buffer, so the stall reaches the engine after a few KiB.
    cfg.server.socket_send_buffer_bytes = 4096;
    cfg
}

async fn start(grace_s: f64) -> TestServer {
    let spec = TestModelSpec::default().max_position_embeddings(8192);
    start_server_with(config(grace_s), &spec).await
}

/// A WebSocket client on a plain TCP socket whose receive buffer is small (set before connect,
/// so the window it advertises stays small); it reads only when told to.
struct RawClient {
    tcp: TcpStream,
    buf: BytesMut,
    codec: Codec,
}

impl RawClient {
    async fn connect(port: u16) -> RawClient {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        sock.connect(&addr.into()).unwrap();
        sock.set_nonblocking(true).unwrap();
        let mut tcp = TcpStream::from_std(sock.into()).unwrap();
        let req = format!(
            "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        tcp.write_all(req.as_bytes()).await.unwrap();
        // The response head, byte by byte so that no frame is consumed with it.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(tcp.read_u8().await.unwrap());
        }
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        RawClient {
            tcp,
            buf: BytesMut::new(),
            codec: Codec::new().client_mode().max_size(1 << 24),
        }
    }

    async fn send(&mut self, v: Value) {
        let mut out = BytesMut::new();
        self.codec
            .encode(Message::Text(v.to_string().into()), &mut out)
            .unwrap();
        self.tcp.write_all(&out).await.unwrap();
    }

    /// Reads frames until a close frame or the end of the connection: (frames, bytes read,
    /// close code, whether the connection ended without a close frame).
    async fn read_all(&mut self) -> (Vec<Value>, usize, Option<u16>) {
        let (mut frames, mut bytes) = (Vec::new(), 0);
        loop {
            while let Some(f) = self.codec.decode(&mut self.buf).unwrap() {
                match f {
                    Frame::Text(t) => frames.push(serde_json::from_slice(&t).unwrap()),
                    Frame::Close(reason) => {
                        return (frames, bytes, reason.map(|r| u16::from(r.code)))
                    }
                    _ => {}
                }
            }
            let mut chunk = [0u8; 65536];
            let n = tokio::time::timeout(Duration::from_secs(30), self.tcp.read(&mut chunk))
                .await
                .expect("no data within 30 s")
                .unwrap_or(0); // a reset ends the stream like an EOF
            if n == 0 {
                return (frames, bytes, None);
            }
            bytes += n;
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn gen(id: &str, max_tokens: usize) -> Value {
    generate(id, "Tell me everything about the ocean.", max_tokens)
}

/// Polls /metrics until `pred` holds (tests may poll; the server does not).
async fn wait_metrics(server: &TestServer, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = http_get(&server.url("/metrics")).await;
        if pred(&m) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{m}"
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A stalls; B is served meanwhile; A's request is cancelled at the limit, KV freed.
async fn stall_then_serve_another(server: &TestServer, a: &mut RawClient) -> String {
    a.send(gen("a", MAX_TOKENS)).await;
    // A's session froze: output piles up unread.
    wait_metrics(server, "unread output", |m| {
        metric(m, "brook:websocket_unread_bytes") > 0.0
    })
    .await;
    let mut b = Client::connect(server).await;
    b.send(gen("b", 20)).await;
    let frames = b.collect(&["b"]).await;
    let done = terminal(&frames["b"]);
    assert_eq!(done["type"], "done", "{done}");
    assert_eq!(done["usage"]["completion_tokens"], 20);
    b.close().await;
    // Counted when it trips: the error frame itself waits for the frozen session.
    let m = wait_metrics(server, "the slow consumer", |m| {
        metric(m, "brook:websocket_slow_consumers_total") == 1.0
    })
    .await;
    // A was stopped far short of its max_tokens: the engine spent nothing more on it.
    let generated = metric(&m, "brook:generation_tokens_total");
    assert!(
        generated < (MAX_TOKENS / 2) as f64,
        "{generated} tokens generated"
    );
    wait_idle(server).await
}

#[actix_rt::test]
async fn a_client_that_stops_reading_is_cancelled_and_others_are_served() {
    let server = start(60.0).await;
    let mut a = RawClient::connect(server.port).await;
    stall_then_serve_another(&server, &mut a).await;
    // A reads again: what the server held for it, then the error and a close 1008.
    let (frames, bytes, close) = a.read_all().await;
    assert_eq!(close, Some(1008), "{:?}", frames.last());
    let last = frames.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["code"].as_str()),
        (Some("error"), Some("slow_consumer")),
        "{last}"
    );
    // Bounded: the unread output when it tripped is the limit plus one step's text, and all
    // the server had buffered for the socket (kernel, actix, channels) is well under 1 MiB.
    let msg = last["message"].as_str().unwrap();
    let unread: usize = msg.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(
        unread > UNREAD_LIMIT && unread < UNREAD_LIMIT + 256,
        "{msg}"
    );
    assert!(
        bytes < 1 << 20,
        "{bytes} bytes were buffered for the socket"
    );
    let m = wait_metrics(&server, "the socket to go", |m| {
        metric(m, "brook:websocket_connections") == 0.0
    })
    .await;
    assert_eq!(metric(&m, "brook:websocket_unread_bytes"), 0.0);
    // Counted once it went out, as every error is.
    assert!(
        m.contains("brook:request_errors_total{code=\"slow_consumer\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("brook:websocket_closes_total{reason=\"slow_consumer\"} 1"),
        "{m}"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn a_client_that_never_reads_again_is_cut_after_the_grace() {
    let server = start(0.3).await;
    let mut a = RawClient::connect(server.port).await;
    stall_then_serve_another(&server, &mut a).await;
    // Its session stays frozen; the watchdog cuts the connection, which frees the slot.
    let m = wait_metrics(&server, "the cut", |m| {
        metric(m, "brook:websocket_connections") == 0.0
    })
    .await;
    assert!(
        m.contains("brook:websocket_closes_total{reason=\"slow_consumer_cut\"} 1"),
        "{m}"
    );
    assert_eq!(metric(&m, "brook:websocket_unread_bytes"), 0.0);
    // The client finds the bytes that had reached its side, then the end: no close frame.
    let (_, _, close) = a.read_all().await;
    assert_eq!(close, None);
    server.stop().await;
}
