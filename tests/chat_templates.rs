//! Real chat templates of the model families brook runs (tests/fixtures/chat_templates, the
//! `chat_template` of each model's tokenizer_config.json) rendered by brook's minijinja
//! environment exactly as transformers' apply_chat_template renders them (goldens.json, made by
//! tools/model_goldens/chat_goldens.py): the same text, or the same refusal from the template.

use std::path::Path;

use brook::chat::{ChatError, ChatMessage, ChatTemplate};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Special {
    bos_token: Option<String>,
    eos_token: Option<String>,
}

#[derive(Deserialize)]
struct TemplateGoldens {
    special_tokens: Special,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Goldens {
    templates: std::collections::BTreeMap<String, TemplateGoldens>,
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates")
}

fn check(name: &str) {
    let goldens: Goldens =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("goldens.json")).unwrap())
            .unwrap();
    let g = &goldens.templates[name];
    let src = std::fs::read_to_string(fixtures().join(format!("{name}.jinja"))).unwrap();
    let t = ChatTemplate::new(
        &src,
        g.special_tokens.bos_token.clone(),
        g.special_tokens.eos_token.clone(),
    )
    .unwrap();
    assert!(g.cases.len() >= 14, "{name}: {} cases", g.cases.len());
    for (i, c) in g.cases.iter().enumerate() {
        let got = t.render(&c.messages, c.add_generation_prompt);
        match (&c.rendered, &c.error, got) {
            (Some(want), None, Ok(got)) => assert_eq!(&got, want, "{name} case {i}"),
            (None, Some(want), Err(ChatError::Raised(got))) => {
                assert_eq!(&got, want, "{name} case {i}")
            }
            (_, _, got) => panic!(
                "{name} case {i}: transformers gave {:?} / {:?}, brook {got:?}",
                c.rendered, c.error
            ),
        }
    }
}

#[test]
fn llama_3_1_renders_as_transformers() {
    check("Llama-3.1-8B-Instruct");
}

#[test]
fn mistral_nemo_renders_and_refuses_as_transformers() {
    check("Mistral-Nemo-Instruct-2407");
}

#[test]
fn phi_3_5_renders_as_transformers() {
    check("Phi-3.5-mini-instruct");
}

#[test]
fn qwen2_5_renders_as_transformers() {
    check("Qwen2.5-7B-Instruct");
}

#[test]
fn qwen3_renders_as_transformers() {
    check("Qwen3-0.6B");
}
