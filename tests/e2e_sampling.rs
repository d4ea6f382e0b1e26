//! End to end over the WebSocket API: the sampler's request features — log-probabilities,
//! logit bias, min_tokens, penalties — through validation, the scheduler, the CPU executor and
//! the output processor (the sampler's arithmetic itself is unit-tested against a reference in
//! sampling/sampler/tests.rs).
mod common;

use common::*;
use serde_json::{json, Value};

async fn run_one(c: &mut Client, id: &str, params: Value) -> Vec<Value> {
    c.send(json!({"type":"generate","id":id,"prompt":"Hello there, how are you?","params":params}))
        .await;
    c.collect(&[id]).await.remove(id).unwrap()
}

/// The log-probability entries of a request's deltas, checked against the token counts.
fn logprobs_of(frames: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for f in frames.iter().filter(|f| f["type"] == "delta") {
        let lps = f["logprobs"].as_array().expect("deltas carry logprobs");
        assert_eq!(lps.len() as u64, f["tokens"].as_u64().unwrap(), "{f}");
        out.extend(lps.iter().cloned());
    }
    out
}

#[actix_rt::test]
async fn logprobs_come_with_every_token_and_greedy_takes_the_top_one() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    let fs = run_one(
        &mut c,
        "lp",
        json!({"max_tokens":8,"temperature":0,"ignore_eos":true,"logprobs":3}),
    )
    .await;
    let done = terminal(&fs);
    assert_eq!(done["usage"]["completion_tokens"], 8, "{done}");
    let lps = logprobs_of(&fs);
    assert_eq!(lps.len(), 8);
    for e in &lps {
        let top = e["top"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        let v: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(v[0] <= 0.0 && v[0] >= v[1] && v[1] >= v[2], "{e}");
        // Greedy: the sampled token is the most likely one.
        assert_eq!(e["id"], top[0]["id"], "{e}");
        assert_eq!(e["logprob"], top[0]["logprob"], "{e}");
        assert!(e["token"].is_string());
    }
    // Without `logprobs`, deltas carry none.
    let fs = run_one(&mut c, "plain", json!({"max_tokens":3,"ignore_eos":true})).await;
    assert!(fs.iter().all(|f| f.get("logprobs").is_none()), "{fs:?}");
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn logit_bias_and_min_tokens_steer_the_output() {
    let server = start_server(test_config()).await;
    let eos = server.engine.validation().defaults().eos_token_ids[0];
    let mut c = Client::connect(&server).await;
    // +100 on one id: every sampled token is that id.
    let fs = run_one(
        &mut c,
        "bias",
        json!({"max_tokens":6,"seed":1,"ignore_eos":true,"logprobs":0,"logit_bias":{"77":100}}),
    )
    .await;
    let ids: Vec<u64> = logprobs_of(&fs)
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![77; 6]);
    // +100 on eos, masked until min_tokens: exactly min_tokens tokens, then eos ends it.
    let fs = run_one(
        &mut c,
        "min",
        json!({"max_tokens":20,"seed":2,"min_tokens":5,"logprobs":0,
               "logit_bias":{eos.to_string():100}}),
    )
    .await;
    let done = terminal(&fs);
    assert_eq!(done["finish_reason"], "stop", "{done}");
    assert_eq!(done["usage"]["completion_tokens"], 6, "{done}");
    let ids: Vec<u64> = logprobs_of(&fs)
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .collect();
    assert!(ids[..5].iter().all(|&t| t != eos as u64), "{ids:?}");
    assert_eq!(ids[5], eos as u64);
    server.close_and_stop(c).await;
}

#[actix_rt::test]
async fn presence_and_frequency_penalties_stop_greedy_repeats() {
    let server = start_server(test_config()).await;
    let mut c = Client::connect(&server).await;
    let base = json!({"max_tokens":24,"temperature":0,"ignore_eos":true,"logprobs":0});
    let ids = |fs: &[Value]| -> Vec<u64> {
        logprobs_of(fs)
            .iter()
            .map(|e| e["id"].as_u64().unwrap())
            .collect()
    };
    let distinct = |v: &[u64]| {
        let mut d = v.to_vec();
        d.sort_unstable();
        d.dedup();
        d.len()
    };
    let plain = ids(&run_one(&mut c, "plain", base.clone()).await);
    let mut p = base.clone();
    p["presence_penalty"] = json!(2.0);
    p["frequency_penalty"] = json!(2.0);
    let penalized = ids(&run_one(&mut c, "pen", p).await);
    // A random-weight model's greedy output loops; -4 or more on every token it produced
    // already (its logits spread far less) makes every token a new one.
    assert!(distinct(&plain) < plain.len(), "greedy repeats: {plain:?}");
    assert_eq!(distinct(&penalized), penalized.len(), "{penalized:?}");
    // The repetition penalty is accepted and applied (it changes the output).
    let mut p = base.clone();
    p["repetition_penalty"] = json!(20.0);
    let rep = ids(&run_one(&mut c, "rep", p).await);
    assert_ne!(rep, plain);
    server.close_and_stop(c).await;
}
