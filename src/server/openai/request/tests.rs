use serde_json::json;

use super::*;

fn chat(v: Value) -> Result<Parsed, ApiError> {
    parse(Endpoint::Chat, v.to_string().as_bytes())
}

fn completion(v: Value) -> Result<Parsed, ApiError> {
    parse(Endpoint::Completion, v.to_string().as_bytes())
}

fn refused(r: Result<Parsed, ApiError>) -> (Option<String>, String) {
    let e = r.unwrap_err();
    assert_eq!(e.error.http_status(), 400, "{e:?}");
    (e.param, e.error.to_string())
}

fn msgs() -> Value {
    json!([{"role": "user", "content": "Hi"}])
}

#[test]
fn a_minimal_chat_request() {
    let p = chat(json!({"model": "m", "messages": msgs()})).unwrap();
    assert_eq!(
        (p.model.as_str(), p.requests[0].n, p.stream, p.include_usage),
        ("m", Some(1), false, false)
    );
    assert_eq!(p.requests.len(), 1);
    let r = &p.requests[0];
    assert!(matches!(&r.input, PromptInput::Messages(m) if m[0].content == "Hi"));
    assert!(r.params.max_tokens.is_none() && r.params.logprobs.is_none());
}

#[test]
fn every_sampling_field_reaches_the_params() {
    let p = chat(json!({
        "model": "m", "messages": msgs(), "max_completion_tokens": 9, "temperature": 0.5,
        "top_p": 0.9, "n": 2, "stop": "\n", "seed": -1, "presence_penalty": 0.1,
        "frequency_penalty": 0.2, "logit_bias": {"5": -100}, "logprobs": true,
        "top_logprobs": 3, "stream": true, "stream_options": {"include_usage": true},
        "user": "u1", "top_k": -1, "min_p": 0.05, "repetition_penalty": 1.1,
        "ignore_eos": true, "min_tokens": 2, "stop_token_ids": [7]
    }))
    .unwrap();
    assert_eq!(
        (p.requests[0].n, p.stream, p.include_usage, p.logprobs),
        (Some(2), true, true, Some(3))
    );
    assert_eq!(p.user.as_deref(), Some("u1"));
    let r = &p.requests[0].params;
    assert_eq!(r.max_tokens, Some(9));
    assert_eq!(
        (r.temperature, r.top_p, r.min_p),
        (Some(0.5), Some(0.9), Some(0.05))
    );
    assert_eq!(r.stop, Some(vec!["\n".to_string()]));
    assert_eq!(r.seed, Some(u64::MAX));
    assert_eq!(
        (r.presence_penalty, r.frequency_penalty),
        (Some(0.1), Some(0.2))
    );
    assert_eq!(r.repetition_penalty, Some(1.1));
    assert_eq!(r.logit_bias.as_ref().unwrap()["5"], -100.0);
    assert_eq!(
        (r.top_k, r.ignore_eos, r.min_tokens),
        (Some(0), Some(true), Some(2))
    );
    assert_eq!(
        (r.logprobs, r.stop_token_ids.clone()),
        (Some(3), Some(vec![7]))
    );
}

#[test]
fn unsupported_and_unknown_fields_are_refused_by_name() {
    let (param, msg) = refused(chat(json!({"model": "m", "messages": msgs(), "tools": []})));
    assert_eq!(param.as_deref(), Some("tools"));
    assert!(msg.contains("not supported"), "{msg}");
    let r =
        chat(json!({"model": "m", "messages": msgs(), "response_format": {"type": "json_object"}}));
    assert_eq!(refused(r).0.as_deref(), Some("response_format"));
    // null is absent.
    assert!(chat(json!({"model": "m", "messages": msgs(), "tools": null})).is_ok());
    let (param, msg) = refused(chat(
        json!({"model": "m", "messages": msgs(), "temprature": 1}),
    ));
    assert_eq!(param.as_deref(), Some("temprature"));
    assert!(msg.contains("unrecognized"), "{msg}");
    // Chat-only fields are unknown to completions and the other way round.
    assert!(completion(json!({"model": "m", "prompt": "x", "top_logprobs": 1})).is_err());
    assert!(chat(json!({"model": "m", "messages": msgs(), "echo": false})).is_err());
}

#[test]
fn field_rules() {
    let base = || json!({"model": "m", "messages": msgs()});
    let with = |k: &str, v: Value| {
        let mut b = base();
        b[k] = v;
        b
    };
    assert_eq!(
        refused(chat(json!({"messages": msgs()}))).0.as_deref(),
        Some("model")
    );
    assert_eq!(refused(chat(with("n", json!(0)))).0.as_deref(), Some("n"));
    assert_eq!(refused(chat(with("n", json!(17)))).0.as_deref(), Some("n"));
    assert_eq!(
        refused(chat(with("stream_options", json!({"include_usage": true}))))
            .0
            .as_deref(),
        Some("stream_options")
    );
    assert_eq!(
        refused(chat(with("top_logprobs", json!(2)))).0.as_deref(),
        Some("top_logprobs")
    );
    let mut b = with("logprobs", json!(true));
    b["top_logprobs"] = json!(21);
    assert_eq!(refused(chat(b)).0.as_deref(), Some("top_logprobs"));
    let mut b = with("max_tokens", json!(5));
    b["max_completion_tokens"] = json!(6);
    assert_eq!(refused(chat(b)).0.as_deref(), Some("max_tokens"));
    assert_eq!(
        refused(chat(with("stop", json!(3)))).0.as_deref(),
        Some("stop")
    );
    assert_eq!(
        refused(chat(with("temperature", json!("hot"))))
            .0
            .as_deref(),
        Some("temperature")
    );
    let e = parse(Endpoint::Chat, b"{nope").unwrap_err();
    assert_eq!(e.error.code(), "invalid_json");
}

#[test]
fn messages_take_text_parts_and_refuse_the_rest() {
    let parse_msgs = |m: Value| chat(json!({"model": "m", "messages": m}));
    let p = parse_msgs(json!([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]))
    .unwrap();
    let PromptInput::Messages(m) = &p.requests[0].input else {
        panic!("messages")
    };
    assert_eq!(
        (m[0].role.as_str(), m[1].content.as_str()),
        ("system", "a\nb")
    );
    let image =
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
    assert!(refused(parse_msgs(image)).1.contains("image_url"));
    assert!(refused(parse_msgs(
        json!([{"role": "user", "content": "x", "name": "bob"}])
    ))
    .1
    .contains("name"));
    assert!(
        refused(parse_msgs(json!([{"role": "wizard", "content": "x"}])))
            .1
            .contains("wizard")
    );
    assert!(refused(parse_msgs(json!([]))).1.contains("non-empty"));
    assert!(refused(parse_msgs(json!([{"role": "user"}])))
        .1
        .contains("content"));
}

#[test]
fn completion_prompts_and_fields() {
    let p = completion(json!({"model": "m", "prompt": "Once"})).unwrap();
    assert!(matches!(&p.requests[0].input, PromptInput::Text(t) if t == "Once"));
    assert_eq!(
        p.requests[0].params.max_tokens,
        Some(COMPLETION_DEFAULT_MAX_TOKENS)
    );
    let p = completion(json!({"model": "m", "prompt": ["a", "b"], "n": 2, "logprobs": 2, "best_of": 2, "echo": false})).unwrap();
    assert_eq!((p.requests.len(), p.logprobs), (2, Some(2)));
    assert!(p.requests.iter().all(|r| r.n == Some(2)));
    assert_eq!(p.requests[1].params.logprobs, Some(2));
    let p = completion(json!({"model": "m", "prompt": [1, 2, 3]})).unwrap();
    assert!(matches!(&p.requests[0].input, PromptInput::Tokens(t) if t == &[1, 2, 3]));
    let p = completion(json!({"model": "m", "prompt": [[1], [2, 3]]})).unwrap();
    assert_eq!(p.requests.len(), 2);
    for bad in [
        json!([]),
        json!(5),
        json!([{"x": 1}]),
        json!([1, "a"]),
        json!([[]]),
    ] {
        assert_eq!(
            refused(completion(json!({"model": "m", "prompt": bad})))
                .0
                .as_deref(),
            Some("prompt")
        );
    }
    // A list of ids names the element that is not one.
    for (bad, at) in [
        (json!([1, -1]), "`prompt[1]`"),
        (json!([1.5]), "`prompt[0]`"),
        (json!([1_099_511_627_776u64]), "`prompt[0]`"),
        (json!([[1], [2, -3]]), "`prompt[1][1]`"),
    ] {
        let (param, msg) = refused(completion(json!({"model": "m", "prompt": bad})));
        assert_eq!(param.as_deref(), Some("prompt"));
        assert!(msg.contains(at) && msg.contains("token id"), "{msg}");
    }
    assert_eq!(
        refused(completion(
            json!({"model": "m", "prompt": "x", "echo": true})
        ))
        .0
        .as_deref(),
        Some("echo")
    );
    assert_eq!(
        refused(completion(
            json!({"model": "m", "prompt": "x", "suffix": "!"})
        ))
        .0
        .as_deref(),
        Some("suffix")
    );
    assert_eq!(
        refused(completion(
            json!({"model": "m", "prompt": "x", "best_of": 3})
        ))
        .0
        .as_deref(),
        Some("best_of")
    );
    assert_eq!(
        refused(completion(
            json!({"model": "m", "prompt": "x", "logprobs": 21})
        ))
        .0
        .as_deref(),
        Some("logprobs")
    );
    let many: Vec<String> = (0..5).map(|i| i.to_string()).collect();
    assert_eq!(
        refused(completion(json!({"model": "m", "prompt": many, "n": 16})))
            .0
            .as_deref(),
        Some("n")
    );
}
