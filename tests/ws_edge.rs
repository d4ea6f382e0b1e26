//! The WebSocket edge end to end (real server, real sockets): RFC 6455 reassembly and close
//! codes, the close handshake and idle timeout, API key and origin checks, and the limits
//! (connections, requests in flight, message rate). The malformed-message corpus
//! (tests/corpus/ws/) is replayed here over a socket; tests/ws_fuzz.rs fuzzes the same parts
//! without one.
mod common;

use std::time::{Duration, Instant};

use actix_http::ws::{Item, OpCode};
use actix_web::web::Bytes;
use awc::ws::{Frame, Message};
use brook::server::auth::ApiKey;
use common::testing::TestModelSpec;
use common::*;
use serde_json::json;

/// `text` as FirstText, Continue…, Last fragments of `size` bytes (split anywhere, even
/// inside a UTF-8 character, as a client may).
fn fragments(text: &str, size: usize) -> Vec<Message> {
    let chunks: Vec<Bytes> = text
        .as_bytes()
        .chunks(size)
        .map(Bytes::copy_from_slice)
        .collect();
    assert!(chunks.len() >= 3);
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            Message::Continuation(match i {
                0 => Item::FirstText(c),
                i if i == last => Item::Last(c),
                _ => Item::Continue(c),
            })
        })
        .collect()
}

/// Asserts the next request works on `c` (the socket survived what came before).
async fn still_serves(c: &mut Client, id: &str) {
    c.send(generate(id, "still there?", 3)).await;
    let frames = c.collect(&[id]).await;
    assert_eq!(terminal(&frames[id])["usage"]["completion_tokens"], 3);
}

#[actix_rt::test]
async fn a_10kb_prompt_in_continuation_frames_is_answered_like_a_whole_one() {
    let spec = TestModelSpec::default().max_position_embeddings(8192);
    let mut cfg = test_config();
    cfg.cache.kv_cache_mib = 16;
    let server = start_server_with(cfg, &spec).await;
    let mut c = Client::connect(&server).await;
    // ~10 KB with multi-byte characters, so fragment boundaries fall inside them too.
    let doc = "Order 58231 shipped from Lyon; the blender — damaged — did not start. ".repeat(140);
    let frame = |id: &str| generate(id, &doc, 6).to_string();
    assert!(frame("x").len() > 10_000);
    for m in fragments(&frame("frag"), 4096 - 3) {
        c.send_msg(m).await;
    }
    c.send_text(frame("whole")).await;
    let frames = c.collect(&["frag", "whole"]).await;
    let (f, w) = (&frames["frag"], &frames["whole"]);
    assert_eq!(terminal(f)["type"], "done", "{f:?}");
    assert_eq!(terminal(f)["usage"]["completion_tokens"], 6);
    assert!(f[0]["prompt_tokens"].as_u64().unwrap() > 1000, "{:?}", f[0]);
    assert_eq!(f[0]["prompt_tokens"], w[0]["prompt_tokens"]);
    assert_eq!(text_of(f), text_of(w));
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn pings_between_fragments_are_answered_and_the_message_still_arrives() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    let mut msgs = fragments(
        &generate("p", "interleaved control frames", 4).to_string(),
        20,
    );
    msgs.insert(1, Message::Ping(Bytes::from_static(b"one")));
    msgs.insert(3, Message::Pong(Bytes::from_static(b"unsolicited")));
    msgs.insert(4, Message::Ping(Bytes::from_static(b"two")));
    for m in msgs {
        c.send_msg(m).await;
    }
    let mut pongs = Vec::new();
    let mut done = false;
    while !done {
        match c.next_frame().await.expect("socket open") {
            Frame::Pong(p) => pongs.push(p),
            Frame::Text(t) => {
                let f: serde_json::Value = serde_json::from_slice(&t).unwrap();
                assert_ne!(f["type"], "error", "{f}");
                done = f["type"] == "done";
            }
            _ => {}
        }
    }
    assert_eq!(
        pongs,
        [Bytes::from_static(b"one"), Bytes::from_static(b"two")]
    );
    c.close().await;
    server.stop().await;
}

/// Each case: what the client sends, the close code it must get; meanwhile another socket's
/// request is unaffected and every KV block comes back.
#[actix_rt::test]
async fn framing_violations_close_with_their_codes_and_others_carry_on() {
    let mut cfg = test_config();
    cfg.server.max_message_bytes = 16 * 1024;
    let server = start_server(cfg).await;
    let mut other = Client::connect(&server).await;
    other.send(generate("keep", "unaffected", 40)).await;

    let text = |p: &[u8], fin| Client::raw_frame(p, OpCode::Text, fin);
    let cont = |p: &[u8], fin| Client::raw_frame(p, OpCode::Continue, fin);
    let big_header = {
        // The header of a 1 GiB text frame, and none of its payload.
        let mut h = vec![0x81u8, 0xff];
        h.extend_from_slice(&(1u64 << 30).to_be_bytes());
        h.extend_from_slice(&[1, 2, 3, 4]);
        h
    };
    let chunk = "a".repeat(6 * 1024);
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "one frame over the limit",
            text("x".repeat(20_000).as_bytes(), true),
            1009,
        ),
        (
            "fragments over the limit together",
            [
                text(chunk.as_bytes(), false),
                cont(chunk.as_bytes(), false),
                cont(chunk.as_bytes(), true),
            ]
            .concat(),
            1009,
        ),
        ("a header declaring 1 GiB", big_header, 1009),
        (
            "a 4 MiB frame, sent whole",
            text(&vec![b'x'; 4 << 20], true),
            1009,
        ),
        (
            "invalid UTF-8 in one frame",
            text(b"{\"type\":\"cancel\",\"id\":\"\xff\"}", true),
            1007,
        ),
        (
            "invalid UTF-8 across fragments",
            [
                text(b"{\"type\":\xe2", false),
                cont(b"\x28\xa1\"x\"}", true),
            ]
            .concat(),
            1007,
        ),
        (
            "a message ending inside a character",
            [text(b"abc", false), cont(b"\xe2\x82", true)].concat(),
            1007,
        ),
        (
            "binary",
            Client::raw_frame(b"\x01\x02", OpCode::Binary, true),
            1003,
        ),
        (
            "fragmented binary",
            Client::raw_frame(b"\x01", OpCode::Binary, false),
            1003,
        ),
        ("a continuation without a start", cont(b"{}", true), 1002),
        (
            "a text frame inside a fragmented message",
            [text(b"{", false), text(b"{}", true)].concat(),
            1002,
        ),
        (
            "a fragmented ping",
            Client::raw_frame(b"p", OpCode::Ping, false),
            1002,
        ),
        (
            "an unmasked frame",
            {
                let mut out = actix_web::web::BytesMut::new();
                actix_http::ws::Parser::write_message(
                    &mut out,
                    &b"{}"[..],
                    OpCode::Text,
                    true,
                    false,
                );
                out.to_vec()
            },
            1002,
        ),
    ];
    for (what, bytes, code) in cases {
        let mut c = Client::connect(&server).await;
        // A request in flight on the failing socket is aborted and its blocks freed.
        c.send(generate("doomed", "in flight when the socket fails", 300))
            .await;
        c.send_raw(&bytes).await;
        assert_eq!(c.expect_close().await, Some(code), "{what}");
        if code == 1007 {
            // ... and the server ends the connection (after actix's 1 s wait for the client
            // to disconnect first, the lingering close RFC 6455 §7.1.1 asks for).
            let t = Instant::now();
            assert!(c.next_frame().await.is_none(), "{what}");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{what}: {:?}",
                t.elapsed()
            );
        }
    }
    let frames = other.collect(&["keep"]).await;
    assert_eq!(terminal(&frames["keep"])["usage"]["completion_tokens"], 40);
    other.close().await;
    let m = wait_idle(&server).await;
    assert_metric_lines(
        &m,
        &[
            r#"brook:websocket_closes_total{reason="protocol_error"} 4"#,
            r#"brook:websocket_closes_total{reason="message_too_big"} 4"#,
            r#"brook:websocket_closes_total{reason="invalid_utf8"} 3"#,
            r#"brook:websocket_closes_total{reason="binary_message"} 2"#,
        ],
    );
    server.stop().await;
}

#[actix_rt::test]
async fn close_handshake_echoes_the_code_and_frees_the_requests() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    c.send(generate("a", "about to close", 300)).await;
    // Close in the middle of a fragmented message.
    c.send_msg(Message::Continuation(Item::FirstText(Bytes::from_static(
        b"{\"ty",
    ))))
    .await;
    c.send_msg(Message::Close(Some(awc::ws::CloseCode::Away.into())))
        .await;
    assert_eq!(c.expect_close().await, Some(1001));
    assert!(
        c.next_frame().await.is_none(),
        "the server ends the connection"
    );
    let m = wait_idle(&server).await;
    assert!(
        m.contains(r#"brook:websocket_closes_total{reason="client"} 1"#),
        "{m}"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn idle_sockets_are_closed_and_pinged_ones_stay() {
    let mut cfg = test_config();
    cfg.server.idle_timeout_s = 1.0;
    cfg.server.ping_interval_s = 0.0;
    let server = start_server(cfg).await;
    let mut c = Client::connect(&server).await;
    let t0 = Instant::now();
    assert_eq!(c.expect_close().await, Some(1000));
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    server.stop().await;

    // With pings every 0.3 s, a client that answers them is never idle.
    let mut cfg = test_config();
    cfg.server.idle_timeout_s = 1.0;
    cfg.server.ping_interval_s = 0.3;
    let server = start_server(cfg).await;
    let mut c = Client::connect(&server).await;
    let t0 = Instant::now();
    let mut pings = 0;
    while t0.elapsed() < Duration::from_millis(2500) {
        match c.next_frame().await.expect("still open") {
            Frame::Ping(p) => {
                pings += 1;
                c.send_msg(Message::Pong(p)).await;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(pings >= 5, "{pings}");
    still_serves(&mut c, "alive").await;
    c.close().await;
    server.stop().await;
}

const KEY: &str = "test-key-0123456789abcdef";

#[actix_rt::test]
async fn api_key_by_header_subprotocol_or_query() {
    let mut cfg = test_config();
    cfg.server.api_key = Some(ApiKey::new(KEY).unwrap());
    let server = start_server(cfg).await;
    // Refused: no key, a wrong key each way.
    assert_eq!(upgrade_status(server.ws_request("/v1/ws")).await, 401);
    assert_eq!(
        upgrade_status(
            server
                .ws_request("/v1/ws")
                .bearer_auth("wrong-key-0123456789")
        )
        .await,
        401
    );
    assert_eq!(
        upgrade_status(
            server
                .ws_request("/v1/ws")
                .protocols(["brook", "bearer.wrong"])
        )
        .await,
        401
    );
    assert_eq!(
        upgrade_status(server.ws_request("/v1/ws?api_key=wrong")).await,
        401
    );
    // Accepted each way; the subprotocol way is answered with `brook`.
    let (_, mut c) = Client::connect_with(server.ws_request("/v1/ws").bearer_auth(KEY))
        .await
        .unwrap();
    still_serves(&mut c, "header").await;
    let (resp, mut c) = Client::connect_with(
        server
            .ws_request("/v1/ws")
            .protocols(["brook", &format!("bearer.{KEY}")]),
    )
    .await
    .unwrap();
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "brook"
    );
    still_serves(&mut c, "subprotocol").await;
    let (_, mut c) = Client::connect_with(server.ws_request(&format!("/v1/ws?api_key={KEY}")))
        .await
        .unwrap();
    still_serves(&mut c, "query").await;

    // HTTP: /health open, /metrics behind the key, with a JSON reason.
    let client = awc::Client::new();
    let mut r = client.get(server.url("/health")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let _ = r.body().await;
    let mut r = client.get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(r.headers().get("www-authenticate").unwrap(), "Bearer");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unauthorized");
    assert!(body["message"].as_str().unwrap().contains("Bearer"));
    let mut r = client
        .get(server.url("/metrics"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let m = String::from_utf8(r.body().await.unwrap().to_vec()).unwrap();
    assert_metric_lines(
        &m,
        &[
            r#"brook:websocket_rejected_total{reason="missing_api_key"} 1"#,
            r#"brook:websocket_rejected_total{reason="wrong_api_key"} 3"#,
        ],
    );
    server.stop().await;
}

#[actix_rt::test]
async fn origins_outside_the_allow_list_are_refused() {
    let mut cfg = test_config();
    cfg.server.allowed_origins = vec!["https://chat.example.com".into()];
    let server = start_server(cfg).await;
    assert_eq!(
        upgrade_status(server.ws_request("/v1/ws").origin("https://evil.example")).await,
        403,
        "a foreign origin was let in"
    );
    let (_, mut c) = Client::connect_with(
        server
            .ws_request("/v1/ws")
            .origin("https://chat.example.com"),
    )
    .await
    .unwrap();
    still_serves(&mut c, "listed").await;
    // The server's own origin is not implied: it must be listed too.
    let own = format!("http://127.0.0.1:{}", server.port);
    assert_eq!(
        upgrade_status(server.ws_request("/v1/ws").origin(own.as_str())).await,
        403,
        "an unlisted origin was let in"
    );
    // No Origin header: not a browser.
    let mut c = Client::connect(&server).await;
    still_serves(&mut c, "no-origin").await;
    server.stop().await;
}

#[actix_rt::test]
async fn connections_beyond_the_limit_get_503_until_one_closes() {
    let mut cfg = test_config();
    cfg.server.max_connections = 2;
    let server = start_server(cfg).await;
    let a = Client::connect(&server).await;
    let mut b = Client::connect(&server).await;
    assert_eq!(
        upgrade_status(server.ws_request("/v1/ws")).await,
        503,
        "a third connection was let in"
    );
    still_serves(&mut b, "b").await;
    a.close().await;
    // The slot frees once the server has finished the closed session.
    let t0 = Instant::now();
    let mut c = loop {
        match Client::connect_with(server.ws_request("/v1/ws")).await {
            Ok((_, c)) => break c,
            Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("slot never freed: {e}"),
        }
    };
    still_serves(&mut c, "c").await;
    let m = http_get(&server.url("/metrics")).await;
    assert!(
        m.contains(r#"brook:websocket_rejected_total{reason="too_many_connections"}"#),
        "{m}"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn requests_in_flight_per_connection_are_bounded() {
    let mut cfg = test_config();
    cfg.server.max_requests_per_connection = 2;
    let server = start_server(cfg).await;
    let mut c = Client::connect(&server).await;
    c.send(generate("a", "first", 200)).await;
    c.send(generate("b", "second", 3)).await;
    c.send(generate("c", "third", 3)).await;
    let mut refused = false;
    let mut b_done = false;
    while !(refused && b_done) {
        let f = c.recv().await.unwrap();
        match (f["id"].as_str(), f["type"].as_str()) {
            (Some("c"), Some("error")) => {
                assert_eq!(f["code"], "overloaded", "{f}");
                assert!(f["retry_after_ms"].as_u64().unwrap() > 0);
                refused = true;
            }
            (Some("b"), Some("done")) => b_done = true,
            (_, Some("error")) => panic!("{f}"),
            _ => {}
        }
    }
    // `b` ended, so there is room again.
    c.send(generate("d", "fourth", 3)).await;
    c.send(json!({"type":"cancel","id":"a"})).await;
    let frames = c.collect(&["a", "d"]).await;
    assert_eq!(terminal(&frames["d"])["type"], "done");
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn message_rate_is_limited_then_the_socket_closed_with_1008() {
    let mut cfg = test_config();
    cfg.server.rate_limit_per_s = 2.0;
    cfg.server.rate_limit_burst = 3;
    cfg.server.rate_limit_close_after = 5;
    let server = start_server(cfg).await;
    let mut c = Client::connect(&server).await;
    for i in 0..4 {
        c.send(generate(&format!("r{i}"), "go", 2)).await;
    }
    let frames = c.collect(&["r0", "r1", "r2", "r3"]).await;
    for id in ["r0", "r1", "r2"] {
        assert_eq!(terminal(&frames[id])["type"], "done", "{id}");
    }
    let limited = terminal(&frames["r3"]);
    assert_eq!(limited["code"], "rate_limited", "{limited}");
    let wait = limited["retry_after_ms"].as_u64().unwrap();
    assert!((1..=500).contains(&wait), "{wait}");
    // Honouring retry_after_ms works.
    tokio::time::sleep(Duration::from_millis(wait)).await;
    still_serves(&mut c, "after-wait").await;
    // Ignoring it: refused, refused, … then closed.
    for i in 0..10 {
        c.send(generate(&format!("spam{i}"), "go", 2)).await;
    }
    assert_eq!(c.expect_close().await, Some(1008));
    wait_idle(&server).await;
    server.stop().await;
}

/// Every file in tests/corpus/ws/ is one malformed message named `<expected code>-<what>.txt`;
/// each gets its error frame and the socket goes on serving.
#[actix_rt::test]
async fn malformed_corpus_gets_error_frames_over_a_socket() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    let corpus = corpus_files();
    assert!(corpus.len() >= 20, "{}", corpus.len());
    for (name, code, text) in &corpus {
        c.send_text(text.clone()).await;
        let f = c
            .recv()
            .await
            .unwrap_or_else(|| panic!("{name}: socket closed"));
        assert_eq!(f["type"], "error", "{name}: {f}");
        assert_eq!(f["code"], code.as_str(), "{name}: {f}");
    }
    still_serves(&mut c, "after-corpus").await;
    server.close_and_stop(c).await;
}
