//! The WebSocket server unchanged on the CUDA executor: `--device cuda`, several multiplexed
//! requests (greedy and seeded sampling), streamed deltas, `done` with the right token counts;
//! and a panic in a CUDA step: the backend is dropped and rebuilt on the GPU and serves the same
//! output again. Without a GPU the tests say so and return; `BROOK_REQUIRE_GPU=1` makes a missing
//! GPU fail. Run them one at a time (`--test-threads=1`, as scripts/gpu-check.sh does): each
//! backend sizes its KV pool from the memory the GPU has free.
mod common;

use common::faults::{Fault, FaultPlan};
use common::testing::TestModelSpec;
use common::*;
use serde_json::json;

/// False (after saying why) when there is no GPU and none is required.
fn have_gpu() -> bool {
    match brook::executor::cuda::probe() {
        Ok(()) => true,
        Err(e) => {
            assert!(
                std::env::var("BROOK_REQUIRE_GPU").map_or(true, |v| v != "1"),
                "no GPU: {e}"
            );
            eprintln!("skipped: {e}");
            false
        }
    }
}

fn cuda_config() -> brook::config::Config {
    let mut cfg = test_config();
    cfg.model.device = "cuda".into();
    cfg.cache.gpu_memory_utilization = 0.3;
    cfg
}

fn cuda_spec() -> TestModelSpec {
    TestModelSpec::default()
        .hidden_size(256)
        .heads(6, 2)
        .head_dim(64)
        .intermediate_size(512)
}

#[actix_rt::test]
async fn a_panicking_cuda_step_rebuilds_the_backend_on_the_gpu() {
    if !have_gpu() {
        return;
    }
    let plan = FaultPlan::new();
    let server = start_server_wrapped(cuda_config(), &cuda_spec(), Some(plan.wrap())).await;
    let blocks = server.engine.info.backend.num_kv_blocks;
    let mut c = Client::connect(&server).await;
    let gen = |id: &str, n: usize| {
        let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(4);
        json!({"type": "generate", "id": id, "prompt": prompt,
               "params": {"max_tokens": n, "ignore_eos": true, "temperature": 0.0}})
    };
    c.send(gen("ref", 12)).await;
    let reference = text_of(&c.collect(&["ref"]).await["ref"]);
    plan.arm(2, Fault::Panic);
    c.send(gen("a", 30)).await;
    let failed = c.collect(&["a"]).await;
    assert_eq!(terminal(&failed["a"])["code"], "internal");
    assert_eq!(plan.built(), 2, "the backend was rebuilt");
    let m = wait_idle(&server).await;
    // The old backend's GPU memory was given back: the new pool is as large (or larger).
    assert!(
        metric(&m, "brook:kv_cache_blocks_total") >= blocks as f64 * 0.99,
        "{m}"
    );
    c.send(gen("again", 12)).await;
    let again = c.collect(&["again"]).await;
    assert_eq!(text_of(&again["again"]), reference);
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn websocket_generation_on_cuda() {
    if !have_gpu() {
        return;
    }
    let server = start_server_with(cuda_config(), &cuda_spec()).await;
    assert!(
        server.engine.info.backend.device.starts_with("cuda:0"),
        "{}",
        server.engine.info.backend.device
    );
    let mut c = Client::connect(&server).await;
    let gen = |id: &str, prompt: &str, n: usize, extra: serde_json::Value| {
        let mut params = json!({"max_tokens": n, "ignore_eos": true, "temperature": 0.0});
        params
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"type": "generate", "id": id, "prompt": prompt, "params": params})
    };
    c.send(gen("a", "Hello there, how are you?", 20, json!({})))
        .await;
    c.send(gen(
        "b",
        "Where is my order?",
        9,
        json!({"temperature": 0.8, "top_p": 0.9, "seed": 4}),
    ))
    .await;
    c.send(gen("c", "Short", 1, json!({}))).await;
    let frames = c.collect(&["a", "b", "c"]).await;
    for (id, want) in [("a", 20), ("b", 9), ("c", 1)] {
        let fs = &frames[id];
        assert_eq!(fs[0]["type"], "started", "{id}: {fs:?}");
        let done = terminal(fs);
        assert_eq!(done["type"], "done", "{id}: {done}");
        assert_eq!(done["usage"]["completion_tokens"], want, "{id}");
    }
    // The same seeded request again gives the same text (seeded draws are batch-independent).
    c.send(gen(
        "b2",
        "Where is my order?",
        9,
        json!({"temperature": 0.8, "top_p": 0.9, "seed": 4}),
    ))
    .await;
    let again = c.collect(&["b2"]).await;
    assert_eq!(text_of(&again["b2"]), text_of(&frames["b"]));
}
