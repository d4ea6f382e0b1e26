//! The WebSocket server unchanged on the CUDA executor: `--device cuda`, several multiplexed
//! requests (greedy and seeded sampling), streamed deltas, `done` with the right token counts.
//! Without a GPU the test says so and returns; `BROOK_REQUIRE_GPU=1` makes a missing GPU fail.
mod common;

use common::testing::TestModelSpec;
use common::*;
use serde_json::json;

#[actix_rt::test]
async fn websocket_generation_on_cuda() {
    if let Err(e) = brook::executor::cuda::probe() {
        assert!(
            std::env::var("BROOK_REQUIRE_GPU").map_or(true, |v| v != "1"),
            "no GPU: {e}"
        );
        eprintln!("skipped: {e}");
        return;
    }
    let mut cfg = test_config();
    cfg.model.device = "cuda".into();
    cfg.cache.gpu_memory_utilization = 0.3;
    let spec = TestModelSpec::default()
        .hidden_size(256)
        .heads(6, 2)
        .head_dim(64)
        .intermediate_size(512);
    let server = start_server_with(cfg, &spec).await;
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
