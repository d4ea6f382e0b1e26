//! End to end: a real server on an ephemeral port, real WebSocket clients.
mod common;

use common::*;
use serde_json::json;

#[actix_rt::test]
async fn multiplexed_requests_stream_and_finish() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    c.send(generate("a", "Hello there, how are you?", 12)).await;
    c.send(json!({"type":"generate","id":"b","messages":[{"role":"user","content":"Where is my order?"}],"params":{"max_tokens":7,"ignore_eos":true,"seed":3}})).await;
    c.send(generate("c", "Short", 1)).await;
    let frames = c.collect(&["a", "b", "c"]).await;
    for (id, want) in [("a", 12), ("b", 7), ("c", 1)] {
        let fs = &frames[id];
        assert_eq!(fs[0]["type"], "started", "{id}: {fs:?}");
        assert!(fs[0]["prompt_tokens"].as_u64().unwrap() > 0);
        let done = terminal(fs);
        assert_eq!(done["type"], "done", "{id}: {done}");
        assert_eq!(done["finish_reason"], "length");
        assert_eq!(done["usage"]["completion_tokens"], want);
        assert!(
            done["timing"]["total_ms"].as_f64().unwrap()
                >= done["timing"]["ttft_ms"].as_f64().unwrap()
        );
        let delta_tokens: u64 = fs
            .iter()
            .filter(|f| f["type"] == "delta")
            .map(|f| f["tokens"].as_u64().unwrap())
            .sum();
        assert!(
            delta_tokens <= want,
            "{id}: deltas carry at most the generated tokens"
        );
    }
    c.close().await;
    let m = wait_idle(&server).await;
    assert!(metric(&m, "brook:generation_tokens_total") >= 20.0);
    server.stop().await;
}

#[actix_rt::test]
async fn cancel_ends_with_cancelled_and_frees_blocks() {
    // The test model makes 400 tokens in tens of milliseconds, less than a cancel's round trip:
    // the engine's second step (the first decode) waits a while, so the cancel lands mid-way.
    let plan = common::faults::FaultPlan::new();
    plan.arm(
        2,
        common::faults::Fault::Hang(std::time::Duration::from_millis(300)),
    );
    let server = start_server_wrapped(
        test_config(),
        &common::testing::TestModelSpec::default(),
        Some(plan.wrap()),
    )
    .await;
    let mut c = Client::connect(&server).await;
    c.send(generate("long", "Tell me a very long story", 400))
        .await;
    // Wait for the first delta, then cancel.
    loop {
        let f = c.recv().await.unwrap();
        if f["type"] == "delta" {
            break;
        }
        assert_ne!(f["type"], "done", "finished before cancel: {f}");
    }
    c.send(json!({"type":"cancel","id":"long"})).await;
    let frames = c.collect(&["long"]).await;
    let done = terminal(&frames["long"]);
    assert_eq!(done["type"], "done");
    assert_eq!(done["finish_reason"], "cancelled");
    assert!(done["usage"]["completion_tokens"].as_u64().unwrap() < 400);
    // The socket still works after a cancel.
    c.send(generate("after", "again", 3)).await;
    let frames = c.collect(&["after"]).await;
    assert_eq!(terminal(&frames["after"])["finish_reason"], "length");
    server.close_and_stop(c).await;
}

/// Sends one bad frame, expects an error with `code` (and `id`), then checks the socket still
/// serves a normal request.
async fn expect_error(c: &mut Client, frame: String, code: &str, id: Option<&str>) {
    c.send_text(frame.clone()).await;
    let f = c
        .recv()
        .await
        .expect("socket must stay open after bad input");
    assert_eq!(f["type"], "error", "{frame} -> {f}");
    assert_eq!(f["code"], code, "{frame} -> {f}");
    assert_eq!(f["id"].as_str(), id, "{frame} -> {f}");
    assert!(!f["message"].as_str().unwrap().is_empty());
}

#[actix_rt::test]
async fn every_bad_input_gets_its_error_and_the_socket_keeps_working() {
    let mut cfg = test_config();
    cfg.server.max_requests_per_connection = 3;
    let server = start_server(cfg).await;
    let mut c = Client::connect(&server).await;

    expect_error(&mut c, "{not json".into(), "invalid_json", None).await;
    expect_error(&mut c, "[1,2,3]".into(), "invalid_request", None).await;
    expect_error(
        &mut c,
        json!({"type":"fly","id":"x"}).to_string(),
        "invalid_request",
        Some("x"),
    )
    .await;
    expect_error(
        &mut c,
        json!({"type":"generate","id":"x","prompt":"a","tempreature":1}).to_string(),
        "invalid_request",
        Some("x"),
    )
    .await;
    expect_error(
        &mut c,
        json!({"type":"generate","id":"x","prompt":"a","params":{"top_p":1.5}}).to_string(),
        "invalid_request",
        Some("x"),
    )
    .await;
    expect_error(
        &mut c,
        json!({"type":"generate","id":"x","prompt":"a","params":{"max_tokens":0}}).to_string(),
        "invalid_request",
        Some("x"),
    )
    .await;
    expect_error(
        &mut c,
        json!({"type":"generate","id":"x","messages":[{"role":"wizard","content":"a"}]})
            .to_string(),
        "invalid_request",
        Some("x"),
    )
    .await;
    expect_error(
        &mut c,
        json!({"type":"generate","id":"x","prompt":""}).to_string(),
        "invalid_request",
        Some("x"),
    )
    .await;
    expect_error(
        &mut c,
        json!({"type":"cancel","id":"nope"}).to_string(),
        "unknown_id",
        Some("nope"),
    )
    .await;
    let long_prompt = "lorem ipsum dolor sit amet ".repeat(400);
    expect_error(
        &mut c,
        json!({"type":"generate","id":"big","prompt":long_prompt}).to_string(),
        "prompt_too_long",
        Some("big"),
    )
    .await;

    // (A binary message closes the socket with 1003: tests/ws_edge.rs.)

    // duplicate_id: the first request is still in flight when the second arrives. These three
    // must still run when their cancels come (else a cancel crosses the request's own end and
    // gets `unknown_id` after its `done`): the demo model decodes 300 tokens in ~0.1 s, which a
    // loaded machine can spend between two of this test's frames, so they ask for 1000.
    c.send(generate("dup", "first", 1000)).await;
    c.send(generate("dup", "second", 3)).await;
    // overloaded: the connection allows 3 in flight.
    c.send(generate("o2", "two", 1000)).await;
    c.send(generate("o3", "three", 1000)).await;
    c.send(generate("o4", "four", 3)).await;
    let mut dup_error = false;
    let mut overloaded = false;
    while !(dup_error && overloaded) {
        let f = c.recv().await.unwrap();
        if f["type"] == "error" {
            match (f["id"].as_str(), f["code"].as_str()) {
                (Some("dup"), Some("duplicate_id")) => dup_error = true,
                (Some("o4"), Some("overloaded")) => {
                    assert!(f["retry_after_ms"].as_u64().is_some());
                    overloaded = true
                }
                other => panic!("unexpected error {other:?}: {f}"),
            }
        }
    }
    for id in ["dup", "o2", "o3"] {
        c.send(json!({"type":"cancel","id":id})).await;
    }
    let frames = c.collect(&["dup", "o2", "o3"]).await;
    for id in ["dup", "o2", "o3"] {
        assert_eq!(terminal(&frames[id])["type"], "done", "{id}");
    }

    // After all that, a normal request still works on the same socket.
    c.send(generate("ok", "still alive?", 4)).await;
    let frames = c.collect(&["ok"]).await;
    assert_eq!(terminal(&frames["ok"])["usage"]["completion_tokens"], 4);
    c.close().await;
    let m = wait_idle(&server).await;
    // Each error counted once, under its code.
    for (code, n) in [
        ("invalid_json", 1),
        ("invalid_request", 7),
        ("unknown_id", 1),
        ("prompt_too_long", 1),
        ("duplicate_id", 1),
        ("overloaded", 1),
    ] {
        let line = format!(r#"brook:request_errors_total{{code="{code}"}} {n}"#);
        assert!(m.contains(&line), "{line}\n{m}");
    }
    server.stop().await;
}

#[actix_rt::test]
async fn oversized_frame_closes_with_1009_and_others_carry_on() {
    let mut cfg = test_config();
    cfg.server.max_message_bytes = 64 * 1024;
    let server = start_server(cfg).await;
    let mut other = Client::connect(&server).await;
    other.send(generate("keep", "unaffected", 20)).await;

    let mut c = Client::connect(&server).await;
    let huge = json!({"type":"generate","id":"h","prompt":"x".repeat(100 * 1024)}).to_string();
    c.send_text(huge).await;
    assert!(c.recv().await.is_none(), "socket must close");
    assert_eq!(c.last_close, Some(1009));

    let frames = other.collect(&["keep"]).await;
    assert_eq!(terminal(&frames["keep"])["usage"]["completion_tokens"], 20);
    other.close().await;
    wait_idle(&server).await;
    server.stop().await;
}

#[actix_rt::test]
async fn disconnect_mid_stream_aborts_and_frees_everything() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    c.send(generate("a", "streaming away", 400)).await;
    c.send(generate("b", "and another one", 400)).await;
    loop {
        let f = c.recv().await.unwrap();
        if f["type"] == "delta" {
            break;
        }
    }
    drop(c); // no close frame: the TCP connection just goes away
    let m = wait_idle(&server).await;
    assert_eq!(metric(&m, "brook:num_requests_running"), 0.0);
    assert_eq!(metric(&m, "brook:kv_cache_blocks_used"), 0.0);
    server.stop().await;
}

#[actix_rt::test]
async fn seeded_sampling_is_independent_of_the_batch() {
    let server = start_server(test_config()).await;
    let sampled = |id: &str| json!({"type":"generate","id":id,"prompt":"Once upon a time","params":{"max_tokens":16,"temperature":0.9,"top_p":0.95,"seed":1234,"ignore_eos":true}});
    let mut c = Client::connect(&server).await;
    c.send(sampled("alone")).await;
    let alone = text_of(&c.collect(&["alone"]).await["alone"]);
    // Same request again, now sharing every step with other requests.
    for i in 0..4 {
        c.send(generate(
            &format!("noise{i}"),
            &"busy ".repeat(i * 7 + 1),
            24,
        ))
        .await;
    }
    c.send(sampled("crowd")).await;
    let frames = c
        .collect(&["noise0", "noise1", "noise2", "noise3", "crowd"])
        .await;
    assert_eq!(alone, text_of(&frames["crowd"]));
    c.close().await;
    server.stop().await;
}

#[actix_rt::test]
async fn stop_string_ends_output_and_is_never_sent() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    c.send(generate("full", "The quick brown fox", 40)).await;
    let full = text_of(&c.collect(&["full"]).await["full"]);
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 12, "need some text to cut: {full:?}");
    // A stop string from the middle of the greedy output.
    let stop: String = chars[6..9].iter().collect();
    let cut = full.find(&stop).unwrap();
    c.send(json!({"type":"generate","id":"s","prompt":"The quick brown fox","params":{"max_tokens":40,"temperature":0.0,"stop":[stop],"ignore_eos":true}})).await;
    let frames = c.collect(&["s"]).await;
    let done = terminal(&frames["s"]);
    assert_eq!(done["finish_reason"], "stop");
    assert_eq!(text_of(&frames["s"]), full[..cut]);
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn http_routes() {
    let server = start_server(test_config()).await;
    let page = http_get(&server.url("/")).await;
    // The page's scripts are under /static/ (tests/dashboard_sse.rs checks those routes).
    assert!(page.contains("/static/js/app.js") && page.contains("Stop"));
    let health: serde_json::Value =
        serde_json::from_str(&http_get(&server.url("/health")).await).unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["device"], "cpu");
    let m = http_get(&server.url("/metrics")).await;
    for name in [
        "brook:num_requests_running",
        "brook:num_requests_waiting",
        "brook:kv_cache_blocks_used",
        "brook:kv_cache_blocks_total",
        "brook:kv_cache_usage_perc",
        "brook:prompt_tokens_total",
        "brook:generation_tokens_total",
        "brook:num_preemptions_total",
    ] {
        metric(&m, name);
    }
    assert!(metric(&m, "brook:kv_cache_blocks_total") > 0.0);
    let mut resp = awc::Client::new()
        .get(server.url("/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let _ = resp.body().await;
    // A known route with a method it does not take: 405 with `Allow` and a JSON body; HEAD
    // works where GET does (load balancers), with no body.
    let client = awc::Client::new();
    for (method, path, allow) in [
        ("POST", "/health", "GET, HEAD"),
        ("DELETE", "/metrics", "GET, HEAD"),
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("POST", "/v1/ws", "GET"),
    ] {
        let m = awc::http::Method::from_bytes(method.as_bytes()).unwrap();
        let mut resp = client.request(m, server.url(path)).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 405, "{method} {path}");
        assert_eq!(
            resp.headers().get("allow").unwrap(),
            allow,
            "{method} {path}"
        );
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "method_not_allowed");
    }
    let mut resp = client.head(server.url("/health")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.body().await.unwrap().is_empty());
    // /v1/ws without an upgrade: 400 with a body that says what the route takes.
    let (status, body) = http_get_json(&server.url("/v1/ws")).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"], "websocket_handshake");
    server.stop().await;
}

#[actix_rt::test]
async fn adaptive_policy_serves_mixed_lengths() {
    let mut cfg = test_config();
    cfg.scheduler.policy = brook::scheduler::Policy::Adaptive;
    cfg.scheduler.classes.short_below = 16;
    cfg.scheduler.classes.long_above = 100;
    let server = start_server(cfg).await;
    let mut c = Client::connect(&server).await;
    let ids = ["s1", "s2", "m1", "l1"];
    c.send(generate("s1", "hi", 8)).await;
    c.send(generate("s2", "hello you", 8)).await;
    c.send(generate("m1", &"a medium sized prompt ".repeat(4), 8))
        .await;
    c.send(generate("l1", &"a long document line ".repeat(30), 8))
        .await;
    let frames = c.collect(&ids).await;
    for id in ids {
        let done = terminal(&frames[id]);
        assert_eq!(done["type"], "done", "{id}: {done}");
        assert_eq!(done["usage"]["completion_tokens"], 8, "{id}");
    }
    c.close().await;
    let m = wait_idle(&server).await;
    assert_metric_lines(
        &m,
        &[
            r#"brook:scheduler_accepted_total{class="long"} 1"#,
            r#"brook:scheduler_accepted_total{class="short"} 2"#,
        ],
    );
    server.stop().await;
}

/// generation_config.json's sampling values become the model's defaults, parsed once at start:
/// a request field overrides them, and they override brook's.
#[actix_rt::test]
async fn generation_config_defaults_reach_requests() {
    use brook::sampling::params::RawSamplingParams;
    use brook::validation::{GenerateRequest, PromptInput};
    let (_dir, path) = model_dir(&common::testing::TestModelSpec::default());
    let gen_path = path.join("generation_config.json");
    let mut gen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&gen_path).unwrap()).unwrap();
    gen["temperature"] = json!(0.25);
    gen["top_k"] = json!(7);
    gen["repetition_penalty"] = json!(1.3);
    std::fs::write(&gen_path, gen.to_string()).unwrap();
    let engine = start_engine(&test_config(), &path);
    let req = |params| GenerateRequest {
        input: PromptInput::Text("Hello".into()),
        params,
        n: None,
    };
    let v = engine.validate(req(RawSamplingParams::default())).unwrap();
    assert_eq!((v.params().temperature, v.params().top_k), (0.25, 7));
    assert_eq!(
        v.params().top_p,
        1.0,
        "brook's default where the model has none"
    );
    let own = RawSamplingParams {
        top_k: Some(3),
        ..Default::default()
    };
    let v = engine.validate(req(own)).unwrap();
    assert_eq!((v.params().temperature, v.params().top_k), (0.25, 3));
    // Applied as the default penalty (the sampler has one).
    assert_eq!(
        engine.validation().defaults().sampling.repetition_penalty,
        1.3
    );
    assert_eq!(v.params().repetition_penalty, 1.3);
    // The eos ids of generation_config.json end generation.
    let eos = &engine.validation().defaults().eos_token_ids;
    for t in gen["eos_token_id"].as_array().unwrap() {
        assert!(eos.contains(&(t.as_u64().unwrap() as u32)), "{eos:?}");
    }
}

#[actix_rt::test]
async fn n_choices_stream_with_their_index_and_one_done_counts_them_all() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    // Greedy: every choice is the n = 1 output; seeded sampling: choice 0 is n = 1's.
    c.send(json!({"type":"generate","id":"g","prompt":"Hello there, how are you?","n":3,"params":{"max_tokens":9,"ignore_eos":true,"temperature":0.0}})).await;
    c.send(generate("one", "Hello there, how are you?", 9))
        .await;
    let frames = c.collect(&["g", "one"]).await;
    let text = |fs: &[serde_json::Value], i: u64| -> String {
        fs.iter()
            .filter(|f| f["type"] == "delta" && f["index"] == i)
            .map(|f| f["text"].as_str().unwrap().to_string())
            .collect()
    };
    let g = &frames["g"];
    assert_eq!(g.iter().filter(|f| f["type"] == "started").count(), 1);
    assert_eq!(g.iter().filter(|f| f["type"] == "done").count(), 1);
    assert_eq!(g.iter().filter(|f| f["type"] == "choice_done").count(), 2);
    let done = terminal(g);
    assert_eq!(done["type"], "done", "{done}");
    assert_eq!(
        done["usage"]["completion_tokens"], 27,
        "all three choices count"
    );
    let single = text(&frames["one"], 0);
    assert!(!single.is_empty());
    for i in 0..3 {
        assert_eq!(text(g, i), single, "choice {i}");
    }
    c.send(json!({"type":"generate","id":"bad","prompt":"a","n":0}))
        .await;
    let f = c.recv().await.unwrap();
    assert_eq!(f["type"], "error");
    assert!(f["message"].as_str().unwrap().contains("`n`"), "{f}");
    c.close().await;
    let m = wait_idle(&server).await;
    assert_eq!(metric(&m, "brook:kv_cache_blocks_used"), 0.0);
    server.stop().await;
}
