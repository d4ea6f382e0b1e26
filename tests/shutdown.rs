//! Graceful shutdown of a real `brook serve` process on a real signal (issue 17): after SIGTERM
//! (or Ctrl-C) new upgrades and new requests get `shutting_down`, /health reports draining, the
//! request in flight finishes, its socket closes with 1001 and the process exits 0; when the
//! request outlasts `--shutdown-timeout` it ends with `shutting_down` instead.
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::testing::TestModelSpec;
use common::*;
use serde_json::Value;

struct Served {
    child: Child,
    port: u16,
    log: mpsc::Receiver<String>,
    _model: tempfile::TempDir,
}

impl Served {
    /// `brook serve` on a test model, any free port, `--shutdown-timeout secs`.
    fn start(timeout_s: f64) -> Served {
        let spec = TestModelSpec::default().max_position_embeddings(8192);
        let (model, path) = model_dir(&spec);
        let mut child = Command::new(env!("CARGO_BIN_EXE_brook"))
            .args([
                "serve",
                "--device",
                "cpu",
                "--cpu-threads",
                "2",
                "--kv-cache-mib",
                "16",
            ])
            .arg("--model")
            .arg(&path)
            .args(["--port", "0", "--shutdown-timeout", &timeout_s.to_string()])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut served = Served {
            child,
            port: 0,
            log,
            _model: model,
        };
        let line = served.wait_log("brook listening on http://");
        // "brook listening on http://HOST:PORT  (chat page: …)"
        let addr = line.split("http://").nth(1).unwrap();
        let port = addr.split(':').nth(1).unwrap();
        served.port = port.split_whitespace().next().unwrap().parse().unwrap();
        served
    }

    /// The next log line containing `what` (panics after 60 s, with what was logged).
    fn wait_log(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        panic!("no log line with {what:?}; log:\n{}", seen.join("\n"));
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// The exit status, waiting up to `secs`.
    fn wait_exit(&mut self, secs: u64) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running {secs} s after the signal"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    async fn connect(&self) -> Client {
        let req = awc::Client::new().ws(format!("ws://127.0.0.1:{}/v1/ws", self.port));
        Client::connect_with(req).await.unwrap().1
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gen(id: &str, max_tokens: usize) -> Value {
    generate(id, "Tell me a long story.", max_tokens)
}

/// Sends a request and waits for its first delta: it is in flight.
async fn start_request(c: &mut Client, id: &str, max_tokens: usize) -> Vec<Value> {
    c.send(gen(id, max_tokens)).await;
    let mut frames = Vec::new();
    loop {
        let f = c.recv().await.expect("socket open");
        let delta = f["type"] == "delta";
        frames.push(f);
        if delta {
            return frames;
        }
    }
}

/// /health's status code and `status` field.
async fn health(url: &str) -> (u16, String) {
    let (status, body) = http_get_json(url).await;
    (status, body["status"].as_str().unwrap().to_owned())
}

#[actix_rt::test]
async fn sigterm_drains_the_requests_in_flight_then_exits_0() {
    let mut s = Served::start(60.0);
    assert_eq!(health(&s.url("/health")).await, (200, "ok".into()));
    let mut c = s.connect().await;
    let mut frames = start_request(&mut c, "long", 1500).await;
    s.signal("TERM");
    s.wait_log("SIGTERM: draining");
    assert_eq!(health(&s.url("/health")).await, (503, "draining".into()));
    // No new sockets...
    let upgrade = awc::Client::new().ws(format!("ws://127.0.0.1:{}/v1/ws", s.port));
    assert_eq!(upgrade_status(upgrade).await, 503, "upgrade during drain");
    // ...and no new requests on the open one, while the one in flight carries on.
    c.send(gen("late", 3)).await;
    let mut late = None;
    loop {
        let f = c
            .recv()
            .await
            .expect("the socket stays open until its request ends");
        if f["id"] == "late" {
            late = Some(f);
            continue;
        }
        let end = matches!(f["type"].as_str(), Some("done") | Some("error"));
        frames.push(f);
        if end {
            break;
        }
    }
    let late = late.expect("an answer to the late request");
    assert_eq!(
        (late["type"].as_str(), late["code"].as_str()),
        (Some("error"), Some("shutting_down")),
        "{late}"
    );
    let done = terminal(&frames);
    assert_eq!(done["type"], "done", "{done}");
    assert_eq!(done["usage"]["completion_tokens"], 1500);
    // Then the socket closes with 1001 (going away) and the process exits 0.
    assert_eq!(c.recv().await, None);
    assert_eq!(c.last_close, Some(1001));
    s.wait_log("every request finished");
    assert!(s.wait_exit(20).success());
}

#[actix_rt::test]
async fn ctrl_c_past_the_timeout_ends_what_is_left_with_shutting_down() {
    let mut s = Served::start(0.5);
    let mut c = s.connect().await;
    start_request(&mut c, "endless", 7000).await;
    let t0 = Instant::now();
    s.signal("INT");
    let frames = c.collect(&["endless"]).await;
    let t = terminal(&frames["endless"]);
    assert_eq!(
        (t["type"].as_str(), t["code"].as_str()),
        (Some("error"), Some("shutting_down")),
        "{t}"
    );
    assert_eq!(c.recv().await, None);
    assert_eq!(c.last_close, Some(1001));
    s.wait_log("the shutdown timeout passed");
    assert!(s.wait_exit(20).success());
    // The timeout, plus the server's grace for sockets, plus slack for a loaded machine.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}
