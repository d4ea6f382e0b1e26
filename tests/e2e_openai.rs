//! The OpenAI-compatible API end to end, over real HTTP: bodies and SSE streams as OpenAI
//! shapes them, n choices, seeds, errors (400 naming the field, 404, 401, 413, 429 with
//! Retry-After), and a client that goes away mid-stream (its requests aborted, KV freed). The
//! official Python client runs against the demo model in tests/openai/.
mod common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

const MODEL: &str = "model";

async fn post(
    server: &TestServer,
    path: &str,
    body: Value,
) -> (u16, Value, awc::http::header::HeaderMap) {
    let mut resp = awc::Client::new()
        .post(server.url(path))
        .send_json(&body)
        .await
        .unwrap();
    let bytes = resp.body().limit(1 << 22).await.unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (resp.status().as_u16(), v, resp.headers().clone())
}

/// The `data:` payloads of an SSE body (the final `[DONE]` included, as a string).
fn sse_events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let d = e
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data line: {e:?}"));
            serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.into()))
        })
        .collect()
}

async fn stream(server: &TestServer, path: &str, body: Value) -> Vec<Value> {
    let mut resp = awc::Client::new()
        .post(server.url(path))
        .send_json(&body)
        .await
        .unwrap();
    assert_event_stream(&resp);
    let bytes = resp.body().limit(1 << 22).await.unwrap();
    sse_events(std::str::from_utf8(&bytes).unwrap())
}

fn chat(content: &str, extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": content}]});
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

/// The model's folder name is the served model's name; the test model's folder is a tempdir.
async fn served(server: &TestServer) -> String {
    let (status, v) = http_get_json(&server.url("/v1/models")).await;
    assert_eq!(status, 200);
    assert_eq!(v["object"], "list");
    v["data"][0]["id"].as_str().unwrap().to_string()
}

fn with_model(mut b: Value, model: &str) -> Value {
    b["model"] = json!(model);
    b
}

#[actix_rt::test]
async fn chat_and_completions_whole_and_streamed() {
    let server = start_server(test_config()).await;
    let model = served(&server).await;
    let body = with_model(
        chat("Hello there", json!({"max_tokens": 6, "ignore_eos": true})),
        &model,
    );
    let (status, v, _) = post(&server, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let c = &v["choices"][0];
    assert_eq!(
        (c["index"].clone(), c["finish_reason"].clone()),
        (json!(0), json!("length"))
    );
    assert_eq!(c["message"]["role"], "assistant");
    assert!(c["message"]["content"].is_string());
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 6);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + 6)
    );

    // Streamed, two choices, usage at the end.
    let body = with_model(
        chat(
            "Hello there",
            json!({"max_tokens": 5, "ignore_eos": true, "n": 2, "stream": true,
                   "stream_options": {"include_usage": true}}),
        ),
        &model,
    );
    let evs = stream(&server, "/v1/chat/completions", body).await;
    assert_eq!(evs.last().unwrap(), "[DONE]");
    let usage = &evs[evs.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 10);
    let chunks = &evs[..evs.len() - 2];
    for i in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == i)
            .collect();
        assert_eq!(mine[0]["choices"][0]["delta"]["role"], "assistant");
        let last = mine.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert!(mine
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c["usage"].is_null()));
    }

    // Completions: a prompt list gives n choices each, prompt-major.
    let body = json!({"model": model, "prompt": ["Hello", "Where is"], "n": 2, "max_tokens": 3,
                      "ignore_eos": true, "logprobs": 1});
    let (status, v, _) = post(&server, "/v1/completions", body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"].as_array().unwrap().len(), 4);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    for c in v["choices"].as_array().unwrap() {
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), 3, "{c}");
        assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 3);
        assert_eq!(lp["text_offset"][0], 0);
    }
    let body = json!({"model": model, "prompt": "Hello", "max_tokens": 3, "ignore_eos": true, "stream": true});
    let evs = stream(&server, "/v1/completions", body).await;
    assert_eq!(evs.last().unwrap(), "[DONE]");
    assert_eq!(evs[evs.len() - 2]["choices"][0]["finish_reason"], "length");
    assert!(evs[..evs.len() - 1]
        .iter()
        .all(|e| e["object"] == "text_completion"));
    wait_idle(&server).await;
    server.stop().await;
}

#[actix_rt::test]
async fn seeds_reproduce_and_choices_differ() {
    let server = start_server(test_config()).await;
    let model = served(&server).await;
    let body = |seed: u64| {
        json!({"model": model, "prompt": "Once upon", "max_tokens": 12, "ignore_eos": true,
               "seed": seed, "n": 3, "temperature": 1.0})
    };
    let texts = |v: &Value| -> Vec<String> {
        (v["choices"].as_array().unwrap().iter())
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect()
    };
    let a = texts(&post(&server, "/v1/completions", body(7)).await.1);
    let b = texts(&post(&server, "/v1/completions", body(7)).await.1);
    assert_eq!(a, b, "same seed, same choices");
    assert!(
        a[0] != a[1] || a[1] != a[2],
        "choices are distinct streams: {a:?}"
    );
    // Choice 0 is the request's own seed: n = 1 reproduces it.
    let mut one = body(7);
    one["n"] = json!(1);
    assert_eq!(
        texts(&post(&server, "/v1/completions", one).await.1)[0],
        a[0]
    );
    server.stop().await;
}

#[actix_rt::test]
async fn errors_have_openais_shape_status_and_count() {
    let server = start_server(test_config()).await;
    let model = served(&server).await;
    let cases = [
        (
            chat("x", json!({"tools": [{"type": "function"}]})),
            400,
            Some("tools"),
            "invalid_request",
        ),
        (
            chat("x", json!({"temperature": 300})),
            400,
            Some("temperature"),
            "invalid_request",
        ),
        (
            chat("x", json!({"frobnicate": 1})),
            400,
            Some("frobnicate"),
            "invalid_request",
        ),
        (
            chat("x", json!({"logit_bias": {"999999": 5}})),
            400,
            Some("logit_bias"),
            "invalid_request",
        ),
    ];
    for (body, status, param, code) in cases {
        let (s, v, _) = post(&server, "/v1/chat/completions", with_model(body, &model)).await;
        assert_eq!(s, status, "{v}");
        let e = &v["error"];
        assert_eq!(e["param"], json!(param), "{v}");
        assert_eq!(
            (e["code"].as_str(), e["type"].as_str()),
            (Some(code), Some("invalid_request_error"))
        );
        assert!(e["message"].as_str().unwrap().len() > 5);
    }
    let (s, v, _) = post(&server, "/v1/chat/completions", chat("x", json!({}))).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    // Too many tokens, then too many bytes for the body limit.
    for (prompt, code) in [
        ("word ".repeat(2000), "prompt_too_long"),
        ("x".repeat(2 << 20), "payload_too_large"),
    ] {
        let body = json!({"model": model, "prompt": prompt});
        let (s, v, _) = post(&server, "/v1/completions", body).await;
        assert_eq!((s, v["error"]["code"].as_str()), (413, Some(code)), "{v}");
    }
    let m = http_get(&server.url("/metrics")).await;
    assert!(
        m.contains(r#"brook:request_errors_total{code="invalid_request"} 4"#),
        "{m}"
    );
    assert!(m.contains(r#"brook:request_errors_total{code="model_not_found"} 1"#));
    server.stop().await;
}

#[actix_rt::test]
async fn a_client_that_goes_away_mid_stream_frees_its_requests() {
    let server = start_server(test_config()).await;
    let model = served(&server).await;
    let body = json!({"model": model, "prompt": "Hello", "max_tokens": 400, "ignore_eos": true,
                      "stream": true, "n": 2});
    let mut resp = awc::Client::new()
        .post(server.url("/v1/completions"))
        .send_json(&body)
        .await
        .unwrap();
    // A few chunks arrive: both requests run.
    let mut got = 0;
    while got < 200 {
        got += resp.next().await.unwrap().unwrap().len();
    }
    let m = http_get(&server.url("/metrics")).await;
    assert!(metric(&m, "brook:kv_cache_blocks_used") > 0.0);
    drop(resp);
    let m = wait_idle(&server).await;
    // Aborted long before their 400 tokens each.
    assert!(metric(&m, "brook:generation_tokens_total") < 700.0, "{m}");
    server.stop().await;
}

#[actix_rt::test]
async fn overload_is_429_with_retry_after_and_nothing_runs_on() {
    let mut cfg = test_config();
    cfg.scheduler.max_num_seqs = 1;
    cfg.scheduler.admission.max_waiting_requests = 1;
    let server = start_server(cfg).await;
    let model = served(&server).await;
    // Three choices: one runs, one waits, the third is refused, and with it the request.
    let body = json!({"model": model, "prompt": "Hello", "max_tokens": 200, "ignore_eos": true,
                      "n": 3, "stream": true});
    let (s, v, headers) = post(&server, "/v1/completions", body).await;
    assert_eq!(s, 429, "{v}");
    assert_eq!(v["error"]["code"], "overloaded");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    let secs: u64 = headers
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(secs >= 1);
    // The admitted choices were aborted with it.
    wait_idle(&server).await;
    server.stop().await;
}

#[actix_rt::test]
async fn the_api_key_guards_the_http_api() {
    let key = "0123456789abcdef-test-key";
    let mut cfg = test_config();
    cfg.server.api_key = Some(brook::access::ApiKey::new(key).unwrap());
    let server = start_server(cfg).await;
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish();
    let resp = client.get(server.url("/v1/models")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp.headers().contains_key("www-authenticate"));
    let mut resp = client
        .get(server.url("/v1/models"))
        .insert_header(("Authorization", format!("Bearer {key}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let model = resp.json::<Value>().await.unwrap()["data"][0]["id"].clone();
    let body = json!({"model": model, "prompt": "Hi", "max_tokens": 2});
    let resp = client
        .post(server.url("/v1/completions"))
        .send_json(&body)
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = client
        .post(server.url("/v1/completions"))
        .insert_header(("Authorization", format!("Bearer {key}")))
        .send_json(&body)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    server.stop().await;
}
