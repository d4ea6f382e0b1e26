//! Fault injection end to end (issue 17): a backend wrapper (tests/common/faults.rs) fails an
//! engine step on purpose — an error, a panic, a hang past the step deadline. Each time the
//! step's requests end with `internal`, every KV block comes back, and the server goes on
//! serving new requests; after a panic the backend is rebuilt (the prefix cache, whose K/V was
//! in the old pool, is cleared), and when it cannot be, /health reports the engine failed.
mod common;

use std::time::{Duration, Instant};

use common::faults::{Fault, FaultPlan};
use common::testing::TestModelSpec;
use common::*;
use serde_json::Value;

async fn start(cfg: brook::config::Config, plan: &std::sync::Arc<FaultPlan>) -> TestServer {
    start_server_wrapped(cfg, &TestModelSpec::default(), Some(plan.wrap())).await
}

/// /health's status code and body.
async fn health(server: &TestServer) -> (u16, Value) {
    http_get_json(&server.url("/health")).await
}

/// The one request's terminal frame.
async fn run(c: &mut Client, id: &str, prompt: &str, max_tokens: usize) -> Vec<Value> {
    c.send(generate(id, prompt, max_tokens)).await;
    c.collect(&[id]).await.remove(id).unwrap()
}

/// Runs request "a", which the armed fault fails: its terminal frame, an `internal` error.
async fn run_failed(c: &mut Client, prompt: &str, max_tokens: usize) -> Value {
    let t = terminal(&run(c, "a", prompt, max_tokens).await).clone();
    assert_eq!(t["code"], "internal", "{t}");
    t
}

/// The engine serves a new request in full: `max_tokens` tokens, no error.
async fn assert_serves(c: &mut Client, id: &str, prompt: &str, max_tokens: usize) {
    let after = run(c, id, prompt, max_tokens).await;
    assert_eq!(
        terminal(&after)["usage"]["completion_tokens"],
        max_tokens,
        "{after:?}"
    );
}

fn failures(m: &str, kind: &str) -> f64 {
    metric(
        m,
        &format!("brook:engine_step_failures_total{{kind=\"{kind}\"}}"),
    )
}

#[actix_rt::test]
async fn an_error_in_a_step_fails_its_requests_and_the_engine_serves_on() {
    let plan = FaultPlan::new();
    let server = start(test_config(), &plan).await;
    let mut c = Client::connect(&server).await;
    // The first step that computes both requests fails. (A fixed step count raced: on a loaded
    // machine "b" came after the third step from now, which "a" alone had run.) "a" asks for
    // more tokens so that it is still running when "b" comes.
    plan.arm_batch(2, Fault::Error);
    c.send(generate("a", "Hello there, how are you?", 100))
        .await;
    c.send(generate("b", "Where is my order?", 40)).await;
    let frames = c.collect(&["a", "b"]).await;
    for id in ["a", "b"] {
        let t = terminal(&frames[id]);
        assert_eq!(t["type"], "error", "{id}: {t}");
        assert_eq!(t["code"], "internal");
        assert!(
            t["message"].as_str().unwrap().contains("injected fault"),
            "{t}"
        );
    }
    assert_eq!(plan.fired(), 1);
    let m = wait_idle(&server).await;
    assert_eq!(failures(&m, "error"), 1.0);
    assert_serves(&mut c, "after", "Hello there, how are you?", 5).await;
    assert_eq!(health(&server).await.0, 200);
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn a_panic_rebuilds_the_backend_and_forgets_its_prefix_cache() {
    let plan = FaultPlan::new();
    let server = start(test_config(), &plan).await;
    let mut c = Client::connect(&server).await;
    // Long enough to fill several KV blocks, which the prefix cache then holds.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(4);
    let reference = text_of(&run(&mut c, "ref", &prompt, 8).await);
    assert!(!reference.is_empty());
    // The next step is the prefill (served from the cache), the one after panics.
    plan.arm(2, Fault::Panic);
    let failed = run(&mut c, "a", &prompt, 30).await;
    let t = terminal(&failed);
    assert_eq!(
        (t["type"].as_str(), t["code"].as_str()),
        (Some("error"), Some("internal"))
    );
    assert!(t["message"].as_str().unwrap().contains("panicked"), "{t}");
    assert_eq!(plan.built(), 2, "the backend was rebuilt");
    let m = wait_idle(&server).await;
    assert_eq!(failures(&m, "panic"), 1.0);
    assert_eq!(health(&server).await.0, 200);
    // The new backend's pool holds no K/V: a cache hit on the old blocks would read zeros and
    // change the greedy output.
    let again = run(&mut c, "again", &prompt, 8).await;
    assert_eq!(text_of(&again), reference);
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn a_rebuilt_backend_with_a_smaller_pool_resizes_the_block_manager() {
    let plan = FaultPlan::new();
    plan.shrink_rebuilt();
    let server = start(test_config(), &plan).await;
    let metrics = || async { http_get(&server.url("/metrics")).await };
    let before = metric(&metrics().await, "brook:kv_cache_blocks_total");
    let mut c = Client::connect(&server).await;
    plan.arm(1, Fault::Panic);
    run_failed(&mut c, "Hello", 10).await;
    let m = wait_idle(&server).await;
    assert_eq!(
        metric(&m, "brook:kv_cache_blocks_total"),
        (before as usize / 2) as f64
    );
    assert_eq!(health(&server).await.0, 200);
    assert_serves(&mut c, "b", "Hello", 5).await;
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn a_backend_that_cannot_be_rebuilt_leaves_the_server_up_and_unhealthy() {
    let plan = FaultPlan::new();
    plan.fail_rebuild();
    let server = start(test_config(), &plan).await;
    let mut c = Client::connect(&server).await;
    plan.arm(1, Fault::Panic);
    run_failed(&mut c, "Hello", 10).await;
    wait_idle(&server).await;
    let (status, body) = health(&server).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "failed");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("cannot be built again"),
        "{body}"
    );
    // New requests get a clear error; the socket and the HTTP side keep working.
    let t = terminal(&run(&mut c, "b", "Hello", 3).await).clone();
    assert_eq!(t["code"], "unavailable", "{t}");
    assert!(http_get(&server.url("/metrics")).await.contains("brook:"));
    c.close().await;
    server.stop().await;
}

#[actix_rt::test]
async fn a_step_past_its_deadline_stalls_the_engine_until_it_returns() {
    let plan = FaultPlan::new();
    let mut cfg = test_config();
    cfg.scheduler.step_timeout_s = 0.3;
    let server = start(cfg, &plan).await;
    let mut c = Client::connect(&server).await;
    plan.arm(2, Fault::Hang(Duration::from_millis(2000)));
    let t0 = Instant::now();
    let t = run_failed(&mut c, "Hello there", 20).await;
    assert!(t["message"].as_str().unwrap().contains("deadline"), "{t}");
    // Failed at the deadline, not when the step came back.
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    let (status, body) = health(&server).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("stalled")),
        "{body}"
    );
    let t = terminal(&run(&mut c, "b", "Hello", 3).await).clone();
    assert_eq!(t["code"], "unavailable", "{t}");
    let m = wait_idle(&server).await;
    assert_eq!(failures(&m, "timeout"), 1.0);
    // Once the step returns the engine serves again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while health(&server).await.0 != 200 {
        assert!(Instant::now() < deadline, "the engine did not recover");
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_serves(&mut c, "c", "Hello there", 5).await;
    server.close_and_stop(c).await;
}

/// Speculative decoding with the bundled draft model: a panic in a step that verifies drafts
/// rebuilds the target and the draft model, each with a fresh KV pool (the draft's K/V shares
/// the target's block ids, so its blocks are the request's and all come back); the greedy
/// output after the rebuild, drafted again, is the reference.
#[actix_rt::test]
async fn a_panic_while_speculating_rebuilds_the_draft_model_too() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cfg = test_config();
    cfg.cache.kv_cache_mib = 64;
    cfg.speculative = brook::spec::SpecConfig {
        method: brook::spec::SpecMethod::Draft,
        draft_model: Some(root.join("models/demo-chat-draft")),
        max_depth: 3,
        // Every decode past the cost model's warm-up speculates at max_depth.
        adaptive: false,
        ..Default::default()
    };
    let plan = FaultPlan::new();
    let server = start_server_at(cfg, &root.join("models/demo-chat"), Some(plan.wrap())).await;
    let mut c = Client::connect(&server).await;
    let prompt = "Hello there, how are you?";
    let reference = text_of(&run(&mut c, "ref", prompt, 40).await);
    let m = wait_idle(&server).await;
    let drafted = metric(&m, "brook:spec_decode_num_draft_tokens_total");
    assert!(drafted > 0.0, "the reference run speculated");
    // The prefill, one decode that verifies drafts, then the panic.
    plan.arm(3, Fault::Panic);
    let failed = run(&mut c, "a", prompt, 40).await;
    let t = terminal(&failed);
    assert_eq!(
        (t["type"].as_str(), t["code"].as_str()),
        (Some("error"), Some("internal"))
    );
    assert_eq!(plan.built(), 2, "the backend was rebuilt");
    wait_idle(&server).await;
    let again = run(&mut c, "again", prompt, 40).await;
    assert_eq!(text_of(&again), reference);
    let m = wait_idle(&server).await;
    assert!(
        metric(&m, "brook:spec_decode_num_draft_tokens_total") > drafted,
        "the rebuilt backend drafts"
    );
    assert_eq!(health(&server).await.0, 200);
    c.close().await;
    server.stop().await;
}

/// `EngineCore::shutdown` (every command that starts the engine calls it before exiting): a
/// request still running ends with `shutting_down`, the backend is dropped on the executor's
/// thread before the call returns (not left to be torn down while the process exits), and a
/// request after it fails at once instead of waiting forever.
#[actix_rt::test]
async fn shutdown_ends_the_requests_and_drops_the_backend_before_it_returns() {
    let plan = FaultPlan::new();
    let server = start(test_config(), &plan).await;
    let mut c = Client::connect(&server).await;
    c.send(generate("a", "Hello there, how are you?", 500))
        .await;
    // Running: its first tokens have come.
    let first = c.recv().await.unwrap();
    assert_eq!(first["id"], "a", "{first}");
    assert_eq!(plan.dropped().0, 0);
    server.engine.shutdown().await;
    let (dropped, on) = plan.dropped();
    assert_eq!(dropped, 1, "the one backend built");
    let test_thread = std::thread::current().name().map(str::to_owned);
    assert!(on.is_some() && on != test_thread, "dropped on {on:?}");
    let a = c.collect(&["a"]).await.remove("a").unwrap();
    let t = terminal(&a);
    assert_eq!(t["code"], "shutting_down", "{t}");
    let after = terminal(&run(&mut c, "b", "Where is my order?", 5).await).clone();
    assert_eq!(after["type"], "error", "{after}");
    server.close_and_stop(c).await;
}
