//! The bundled demo models, greedy-decoded by brook on CPU — all cases batched together through
//! the real scheduler core and the paged CPU backend — equal the transformers (float32) golden
//! outputs token for token. Prompt encoding and chat-template rendering are checked against the
//! Python tokenizer's ids too. Fixture: tests/fixtures/demo_golden.json (tools/demo_model/).
mod demo;

use std::path::Path;

use brook::chat::{ChatMessage, ChatTemplate};
use brook::executor::cpu::{CpuBackend, CpuBackendOptions};
use brook::sampling::params::SamplingParams;
use brook::spec::SpecConfig;
use brook::tokenizer::Tokenizer;
use demo::{fixture, ids, root};
use serde_json::Value;

/// Runs every case at once through the scheduler core and the CPU backend, the model split over
/// `tp` ranks; returns each case's generated ids.
fn greedy_batch(dir: &Path, prompts: &[Vec<u32>], max_new: &[usize], tp: usize) -> Vec<Vec<u32>> {
    let opts = CpuBackendOptions {
        block_size: 16,
        kv_cache_bytes: 64 << 20,
        num_threads: None,
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
        tensor_parallel_size: tp,
    };
    let mut backend = CpuBackend::load(dir, opts).unwrap();
    let reqs: Vec<(Vec<u32>, SamplingParams)> = prompts
        .iter()
        .zip(max_new)
        .map(|(p, &n)| (p.clone(), SamplingParams::greedy(n)))
        .collect();
    demo::run(&mut backend, SpecConfig::default(), dir, &reqs, 0).outputs
}

fn check_model(dir: &Path, cases: &[Value]) {
    check_model_tp(dir, cases, 1);
}

/// `check_model` with the model split over `tp` ranks (tensor parallelism).
fn check_model_tp(dir: &Path, cases: &[Value], tp: usize) {
    let tok = Tokenizer::from_dir(dir).unwrap();
    let chat = ChatTemplate::from_tokenizer(&tok)
        .unwrap()
        .expect("demo model has a chat template");
    let mut prompts = Vec::new();
    let mut want = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let prompt_ids = ids(&case["prompt_token_ids"]);
        let add_special = case["add_special_tokens"].as_bool().unwrap_or(true);
        let encoded = match case["kind"].as_str().unwrap() {
            "chat" => {
                let msgs: Vec<ChatMessage> =
                    serde_json::from_value(case["messages"].clone()).unwrap();
                let text = chat.render(&msgs, true).unwrap();
                tok.encode(&text, add_special).unwrap()
            }
            _ => tok
                .encode(case["prompt"].as_str().unwrap(), add_special)
                .unwrap(),
        };
        assert_eq!(
            encoded, prompt_ids,
            "{name}: brook's encoding differs from the Python tokenizer's"
        );
        prompts.push(prompt_ids);
        want.push(ids(&case["output_token_ids"]));
    }
    let max_new: Vec<usize> = want.iter().map(|w| w.len()).collect();
    let got = greedy_batch(dir, &prompts, &max_new, tp);
    for ((case, g), w) in cases.iter().zip(&got).zip(&want) {
        assert_eq!(
            g, w,
            "{} (tensor-parallel size {tp}): brook greedy output differs from transformers",
            case["name"]
        );
    }
}

#[test]
fn demo_chat_matches_transformers_golden_outputs() {
    let f = fixture();
    check_model(
        &root().join("models/demo-chat"),
        f["cases"].as_array().unwrap(),
    );
}

/// The demo model split over two ranks (3 query heads, 1 KV head and half the MLP and the
/// vocabulary each): the same tokens as transformers, so the same as unsplit.
#[test]
fn demo_chat_over_two_tensor_parallel_ranks_matches_the_golden_outputs() {
    let f = fixture();
    check_model_tp(
        &root().join("models/demo-chat"),
        f["cases"].as_array().unwrap(),
        2,
    );
}

#[test]
fn demo_chat_draft_matches_transformers_golden_outputs() {
    let f = fixture();
    check_model(
        &root().join("models/demo-chat-draft"),
        f["draft"]["cases"].as_array().unwrap(),
    );
}

/// Streamed through the whole engine (actors, incremental detokenizer), every golden case's
/// text equals the tokenizer's decode of the golden ids.
#[actix_rt::test]
async fn streamed_text_equals_the_decoded_golden_output() {
    streamed_text_matches(1).await;
}

/// As above with `model.tensor_parallel_size = 2` (the `--tensor-parallel-size` path: the
/// engine checks the split and starts the ranks).
#[actix_rt::test]
async fn streamed_text_over_two_tensor_parallel_ranks_equals_the_golden_output() {
    streamed_text_matches(2).await;
}

async fn streamed_text_matches(tp: usize) {
    let dir = root().join("models/demo-chat");
    let mut cfg = brook::config::Config::default();
    cfg.model.device = "cpu".into();
    cfg.model.tensor_parallel_size = tp;
    cfg.cache.kv_cache_mib = 32;
    let engine = brook::engine::start(&cfg, &dir, false).unwrap();
    let f = fixture();
    let mut pending = Vec::new();
    for case in f["cases"].as_array().unwrap() {
        let want_ids = ids(&case["output_token_ids"]);
        let req = engine
            .validate(brook::validation::GenerateRequest {
                input: brook::validation::PromptInput::Tokens(ids(&case["prompt_token_ids"])),
                params: brook::sampling::params::RawSamplingParams {
                    max_tokens: Some(want_ids.len() as i64),
                    temperature: Some(0.0),
                    ..Default::default()
                },
                n: None,
            })
            .unwrap();
        let (_, rx) = engine.submit(req);
        pending.push((
            case["name"].as_str().unwrap().to_string(),
            engine.tokenizer.decode(&want_ids, true),
            rx,
        ));
    }
    for (name, want, mut rx) in pending {
        let mut text = String::new();
        while let Some(ev) = rx.recv().await {
            match ev {
                brook::request::StreamEvent::Delta { text: t, .. } => text.push_str(&t),
                brook::request::StreamEvent::Error(e) => panic!("{name}: {e}"),
                _ => {}
            }
        }
        assert_eq!(text, want, "{name} (tensor-parallel size {tp})");
    }
}

/// A tensor-parallel size the model does not divide by is refused at start, before the weights
/// load, saying what does not divide.
#[actix_rt::test]
async fn a_tensor_parallel_size_the_model_cannot_split_into_is_refused() {
    let mut cfg = brook::config::Config::default();
    cfg.model.device = "cpu".into();
    cfg.model.tensor_parallel_size = 4;
    let err = brook::engine::start(&cfg, &root().join("models/demo-chat"), false)
        .err()
        .expect("6 heads do not split over 4 ranks")
        .to_string();
    assert!(
        err.contains("--tensor-parallel-size 4") && err.contains("6 attention heads"),
        "{err}"
    );
}
