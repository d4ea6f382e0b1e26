use serde_json::json;

use super::*;
use crate::tokenizer_fixture::TokFixture;

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Llama 3's layout, with Llama 2's role-order check.
const LLAMA3: &str = r#"
{%- for message in messages %}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == (1 if messages[0]['role'] == 'system' else 0)) and message['role'] != 'system' %}
    {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif %}
{%- set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}
{%- if loop.first %}
    {%- set content = bos_token + content %}
{%- endif %}
{{- content }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

/// Zephyr's template relies on trim_blocks/lstrip_blocks for its layout.
const ZEPHYR: &str = "{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}";

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs
        .iter()
        .map(|(role, content)| ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        })
        .collect()
}

fn template(src: &str) -> ChatTemplate {
    ChatTemplate::new(src, Some("<|begin_of_text|>".into()), Some("</s>".into())).unwrap()
}

#[test]
fn chatml_with_and_without_generation_prompt() {
    let t = template(CHATML);
    let m = msgs(&[("system", "Be brief."), ("user", "Hi")]);
    let base = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n";
    assert_eq!(t.render(&m, false).unwrap(), base);
    assert_eq!(
        t.render(&m, true).unwrap(),
        format!("{base}<|im_start|>assistant\n")
    );
}

#[test]
fn llama3_style_bos_trim_and_role_check() {
    let t = template(LLAMA3);
    let m = msgs(&[
        ("system", "  You help.\n"),
        ("user", " Hi "),
        ("assistant", "Hello!"),
        ("user", "Bye"),
    ]);
    let expected =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou help.<|eot_id|>\
        <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
        <|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>\
        <|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>";
    assert_eq!(t.render(&m, false).unwrap(), expected);
    assert_eq!(
        t.render(&m, true).unwrap(),
        format!("{expected}<|start_header_id|>assistant<|end_header_id|>\n\n")
    );

    let err = t
        .render(&msgs(&[("user", "a"), ("user", "b")]), true)
        .unwrap_err();
    assert_eq!(
        err,
        ChatError::Raised(
            "Conversation roles must alternate user/assistant/user/assistant/...".into()
        )
    );
    let engine: EngineError = err.into();
    assert_eq!(engine.code(), "invalid_request");
}

#[test]
fn zephyr_layout_with_trim_and_lstrip_blocks() {
    let t = template(ZEPHYR);
    let m = msgs(&[("system", "S"), ("user", "Hi")]);
    assert_eq!(
        t.render(&m, false).unwrap(),
        "<|system|>\nS</s>\n<|user|>\nHi</s>\n"
    );
    assert_eq!(
        t.render(&m, true).unwrap(),
        "<|system|>\nS</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    );
}

#[test]
fn python_methods_tojson_and_strftime() {
    let t = template(
        "{{ messages[0].content.strip().title() }}|{{ messages[0].role.startswith('us') }}|\
         {{ messages[0].content | tojson }}|{{ [1, 'a'] | tojson }}|\
         {{ {'k': [1]} | tojson(indent=2) }}|{{ strftime_now('%d %b %Y') }}",
    );
    let out = t.render(&msgs(&[("user", "  a<b & 'c' ")]), false).unwrap();
    let parts: Vec<&str> = out.split('|').collect();
    assert_eq!(
        parts[..4],
        ["A<B & 'C'", "True", r#""  a<b & 'c' ""#, r#"[1, "a"]"#]
    );
    assert_eq!(parts[4], "{\n  \"k\": [\n    1\n  ]\n}");
    let date = parts[5].as_bytes();
    assert!(
        date.len() == 11 && date[2] == b' ' && date[6] == b' ',
        "{}",
        parts[5]
    );
}

#[test]
fn missing_bos_renders_empty_not_none() {
    let t = ChatTemplate::new("[{{ bos_token }}]{{ messages[0].content }}", None, None).unwrap();
    assert_eq!(t.render(&msgs(&[("user", "x")]), false).unwrap(), "[]x");
}

#[test]
fn template_from_tokenizer_and_no_template_error() {
    let tok = TokFixture {
        chat_template: Some(json!(
            "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
        )),
        ..Default::default()
    }
    .build();
    let t = ChatTemplate::from_tokenizer(&tok)
        .unwrap()
        .expect("template");
    let m = msgs(&[("user", "hey")]);
    let rendered = render_chat(Some(&t), &m, true).unwrap();
    assert_eq!(rendered, "<|bos|>hey<|eos|>");
    // Encoding the render with special tokens still gives a single bos.
    let ids = tok.encode(&rendered, true).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 0).count(), 1);

    let bare = TokFixture::default().build();
    assert!(ChatTemplate::from_tokenizer(&bare).unwrap().is_none());
    let err = render_chat(None, &m, true).unwrap_err();
    assert_eq!(err, ChatError::NoTemplate);
    assert!(EngineError::from(err)
        .to_string()
        .contains("no chat_template"));
}

#[test]
fn bad_template_is_a_compile_error() {
    let err = ChatTemplate::new("{% for m in messages %}", None, None).unwrap_err();
    assert!(matches!(err, ChatError::Compile(_)), "{err:?}");
    assert_eq!(EngineError::from(err).code(), "internal");
}

#[test]
fn message_validation_names_index_and_field() {
    let cases = [
        (json!({"role": "user"}), "messages must be a list"),
        (json!([]), "messages must be a non-empty list"),
        (json!(["hi"]), "messages[0] must be an object"),
        (
            json!([{"role": "user", "content": "a"}, {"role": "user", "name": "x"}]),
            "messages[1] has unknown field \"name\"",
        ),
        (json!([{"content": "a"}]), "messages[0].role is missing"),
        (
            json!([{"role": 3, "content": "a"}]),
            "messages[0].role must be a string",
        ),
        (
            json!([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]),
            "messages[1].role must be one of system, user, assistant, tool, got \"bot\"",
        ),
        (json!([{"role": "user"}]), "messages[0].content is missing"),
        (
            json!([{"role": "user", "content": null}]),
            "messages[0].content must be a string",
        ),
        (
            json!([{"role": "user", "content": [{"type": "text"}]}]),
            "messages[0].content must be a string",
        ),
    ];
    for (value, expected) in cases {
        let err = parse_messages(&value).unwrap_err();
        assert!(err.to_string().contains(expected), "{value}: {err}");
        assert_eq!(EngineError::from(err).code(), "invalid_request");
    }
    let ok = parse_messages(&json!([{"role": "tool", "content": "42"}])).unwrap();
    assert_eq!(ok, msgs(&[("tool", "42")]));
    // Typed messages go through the same checks in render.
    let t = template(CHATML);
    assert!(matches!(
        t.render(&[], true),
        Err(ChatError::InvalidMessages(_))
    ));
    assert!(matches!(
        t.render(&msgs(&[("robot", "x")]), true),
        Err(ChatError::InvalidMessages(_))
    ));
    // serde's derive rejects unknown fields too, for callers that deserialize directly.
    assert!(
        serde_json::from_value::<ChatMessage>(json!({"role": "user", "content": "a", "x": 1}))
            .is_err()
    );
}

#[test]
fn chat_template_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTemplate>();
}
