//! Helpers for end-to-end tests: a real server on an ephemeral port with a generated
//! random-weight model, and a small WebSocket client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use awc::ws;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};

use brook::config::Config;
use brook::engine::EngineHandle;

pub mod faults;

/// The test-model writer, compiled here rather than into the library (see its header).
#[path = "../../src/model/testing.rs"]
pub mod testing;
use testing::{write_test_model, TestModelSpec};

pub struct TestServer {
    pub port: u16,
    pub engine: Arc<EngineHandle>,
    _dir: Option<tempfile::TempDir>,
    handle: actix_web::dev::ServerHandle,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// A WebSocket request to `path` (which may carry a query) on this server.
    pub fn ws_request(&self, path: &str) -> awc::ws::WebsocketsRequest {
        awc::Client::new().ws(format!("ws://127.0.0.1:{}{}", self.port, path))
    }

    pub async fn stop(self) {
        self.handle.stop(false).await;
    }

    /// Closes `c`, waits until every request and KV block is released, then stops: the end of
    /// a test that must leave nothing behind.
    pub async fn close_and_stop(self, c: Client) {
        c.close().await;
        wait_idle(&self).await;
        self.stop().await;
    }
}

/// Writes a model for `spec` into a temp dir.
pub fn model_dir(spec: &TestModelSpec) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), spec).unwrap();
    let p = dir.path().to_path_buf();
    (dir, p)
}

pub fn test_config() -> Config {
    let mut cfg = Config::default();
    cfg.model.device = "cpu".into();
    cfg.model.cpu_threads = 2;
    cfg.cache.kv_cache_mib = 8;
    cfg.scheduler.max_num_batched_tokens = 256;
    cfg
}

/// Starts engine + HTTP server inside the current actix System.
pub async fn start_server(cfg: Config) -> TestServer {
    start_server_with(cfg, &TestModelSpec::default()).await
}

pub async fn start_server_with(cfg: Config, spec: &TestModelSpec) -> TestServer {
    start_server_wrapped(cfg, spec, None).await
}

/// [`start_server_with`], the backend wrapped by `wrap` (fault injection: `faults.rs`).
pub async fn start_server_wrapped(
    cfg: Config,
    spec: &TestModelSpec,
    wrap: Option<brook::engine::BackendWrap>,
) -> TestServer {
    let (dir, path) = model_dir(spec);
    let mut server = start_server_at(cfg, &path, wrap).await;
    server._dir = Some(dir);
    server
}

/// A server on the model folder `path` (a bundled model), the backend wrapped by `wrap`.
pub async fn start_server_at(
    cfg: Config,
    path: &Path,
    wrap: Option<brook::engine::BackendWrap>,
) -> TestServer {
    let engine = brook::engine::start_wrapped(&cfg, path, false, wrap).unwrap();
    let mut server_cfg = cfg.server.clone();
    server_cfg.host = "127.0.0.1".into();
    server_cfg.port = 0;
    let (server, port) = brook::server::bind(engine.clone(), &server_cfg).unwrap();
    let handle = server.handle();
    actix_rt::spawn(server);
    TestServer {
        port,
        engine,
        _dir: None,
        handle,
    }
}

pub fn start_engine(cfg: &Config, path: &Path) -> Arc<EngineHandle> {
    brook::engine::start(cfg, path, false).unwrap()
}

pub struct Client {
    conn: actix_codec::Framed<awc::BoxedSocket, ws::Codec>,
    /// Close code of the server's close frame, once one arrived.
    pub last_close: Option<u16>,
}

impl Client {
    pub async fn connect(server: &TestServer) -> Client {
        Client::connect_with(server.ws_request("/v1/ws"))
            .await
            .unwrap()
            .1
    }

    /// Connects with a prepared request (headers, subprotocols, query); the upgrade response
    /// comes back too (its headers), or the error (e.g. a refused status).
    pub async fn connect_with(
        req: awc::ws::WebsocketsRequest,
    ) -> Result<(awc::ClientResponse, Client), awc::error::WsClientError> {
        let (resp, conn) = req.max_frame_size(8 << 20).connect().await?;
        Ok((
            resp,
            Client {
                conn,
                last_close: None,
            },
        ))
    }

    /// Sends one WebSocket message as the codec frames it (continuations included).
    pub async fn send_msg(&mut self, m: ws::Message) {
        self.conn.send(m).await.unwrap();
    }

    /// Writes bytes straight to the socket, bypassing the client codec's own checks: for
    /// frames a well-behaved client would never send.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        use std::pin::Pin;
        self.conn.flush().await.unwrap();
        let mut off = 0;
        while off < bytes.len() {
            let io = self.conn.io_mut();
            off += futures_util::future::poll_fn(|cx| {
                tokio::io::AsyncWrite::poll_write(Pin::new(&mut *io), cx, &bytes[off..])
            })
            .await
            .unwrap();
        }
        let io = self.conn.io_mut();
        futures_util::future::poll_fn(|cx| {
            tokio::io::AsyncWrite::poll_flush(Pin::new(&mut *io), cx)
        })
        .await
        .unwrap();
    }

    /// A masked client frame, as raw bytes.
    pub fn raw_frame(payload: &[u8], op: actix_http::ws::OpCode, fin: bool) -> Vec<u8> {
        let mut out = actix_web::web::BytesMut::new();
        actix_http::ws::Parser::write_message(&mut out, payload, op, fin, true);
        out.to_vec()
    }

    /// The next frame of any kind (pings are not answered here); None when the socket ends.
    pub async fn next_frame(&mut self) -> Option<ws::Frame> {
        let frame = tokio::time::timeout(Duration::from_secs(60), self.conn.next())
            .await
            .expect("no frame within 60 s");
        match frame {
            Some(Ok(f)) => {
                if let ws::Frame::Close(reason) = &f {
                    self.last_close = reason.as_ref().map(|r| u16::from(r.code));
                }
                Some(f)
            }
            Some(Err(e)) => panic!("websocket error: {e}"),
            None => None,
        }
    }

    /// Reads until the server's close frame (skipping anything else) and returns its code.
    pub async fn expect_close(&mut self) -> Option<u16> {
        while let Some(f) = self.next_frame().await {
            if let ws::Frame::Close(reason) = f {
                return reason.map(|r| u16::from(r.code));
            }
        }
        None
    }

    pub async fn send_text(&mut self, text: impl Into<String>) {
        self.conn
            .send(ws::Message::Text(text.into().into()))
            .await
            .unwrap();
    }

    pub async fn send(&mut self, v: Value) {
        self.send_text(v.to_string()).await;
    }

    /// Next JSON frame (answering pings), or None when the socket closed. Panics on timeout.
    pub async fn recv(&mut self) -> Option<Value> {
        loop {
            match self.next_frame().await? {
                ws::Frame::Text(t) => return Some(serde_json::from_slice(&t).unwrap()),
                ws::Frame::Ping(p) => self.conn.send(ws::Message::Pong(p)).await.unwrap(),
                ws::Frame::Close(_) => return None,
                _ => {}
            }
        }
    }

    /// Reads frames until every id in `ids` has its terminal frame; returns all frames by id.
    pub async fn collect(&mut self, ids: &[&str]) -> HashMap<String, Vec<Value>> {
        let mut out: HashMap<String, Vec<Value>> = HashMap::new();
        let mut open: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        while !open.is_empty() {
            let f = self.recv().await.expect("socket closed early");
            let id = f["id"].as_str().unwrap_or("").to_string();
            let terminal = matches!(f["type"].as_str(), Some("done") | Some("error"));
            out.entry(id.clone()).or_default().push(f);
            if terminal {
                open.retain(|x| *x != id);
            }
        }
        out
    }

    pub async fn close(mut self) {
        let _ = self.conn.send(ws::Message::Close(None)).await;
    }
}

/// A `generate` frame: greedy, `max_tokens` tokens past any eos.
pub fn generate(id: &str, prompt: &str, max_tokens: usize) -> Value {
    json!({"type":"generate","id":id,"prompt":prompt,"params":{"max_tokens":max_tokens,"ignore_eos":true,"temperature":0.0}})
}

/// The HTTP status of a WebSocket upgrade: 101 when accepted, else the refusal's.
pub async fn upgrade_status(req: awc::ws::WebsocketsRequest) -> u16 {
    match Client::connect_with(req).await {
        Ok(_) => 101,
        Err(awc::error::WsClientError::InvalidResponseStatus(s)) => s.as_u16(),
        Err(e) => panic!("{e}"),
    }
}

/// Concatenated delta text of one request's frames.
pub fn text_of(frames: &[Value]) -> String {
    frames
        .iter()
        .filter(|f| f["type"] == "delta")
        .map(|f| f["text"].as_str().unwrap())
        .collect()
}

pub fn terminal(frames: &[Value]) -> &Value {
    let terms: Vec<&Value> = frames
        .iter()
        .filter(|f| f["type"] == "done" || f["type"] == "error")
        .collect();
    assert_eq!(terms.len(), 1, "exactly one terminal frame: {frames:?}");
    terms[0]
}

pub async fn http_get(url: &str) -> String {
    let mut resp = awc::Client::new().get(url).send().await.unwrap();
    let body = resp.body().limit(1 << 22).await.unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

/// A GET's status and JSON body.
pub async fn http_get_json(url: &str) -> (u16, Value) {
    let mut resp = awc::Client::new().get(url).send().await.unwrap();
    let body: Value = resp.json().await.unwrap();
    (resp.status().as_u16(), body)
}

/// Value of an un-labelled metric in Prometheus text.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("metric {name} missing"))
        .trim()
        .parse()
        .unwrap()
}

/// Asserts that `resp` opened a server-sent event stream (200, `text/event-stream`).
pub fn assert_event_stream<S>(resp: &awc::ClientResponse<S>) {
    assert_eq!(resp.status(), 200);
    let ct = resp
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(ct, "text/event-stream");
}

/// Asserts that the Prometheus text `m` holds each of `lines` (a sample with its value).
pub fn assert_metric_lines(m: &str, lines: &[&str]) {
    for line in lines {
        assert!(m.contains(line), "{line} missing from\n{m}");
    }
}

/// Waits until /metrics shows no running or waiting requests and no KV blocks in use.
pub async fn wait_idle(server: &TestServer) -> String {
    for _ in 0..200 {
        let m = http_get(&server.url("/metrics")).await;
        if metric(&m, "brook:num_requests_running") == 0.0
            && metric(&m, "brook:num_requests_waiting") == 0.0
            && metric(&m, "brook:kv_cache_blocks_used") == 0.0
        {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "engine did not become idle: {}",
        http_get(&server.url("/metrics")).await
    );
}

/// The malformed-message corpus: (file name, expected error code, message text), sorted.
pub fn corpus_files() -> Vec<(String, String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/ws");
    let mut out: Vec<(String, String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let code = name.split('-').next().unwrap().to_string();
            let text = std::fs::read_to_string(&p).unwrap();
            // Editors add a final newline; the message is the file without it.
            let text = text.strip_suffix('\n').unwrap_or(&text).to_string();
            (name, code, text)
        })
        .collect();
    out.sort();
    out
}
