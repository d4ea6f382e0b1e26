//! The whole engine — real scheduler (chunked prefill, token budget, continuous batching), real
//! paged CPU backend — gives the same greedy output as a plain unbatched, unpaged forward of the
//! same weights, for prompts of mixed lengths that arrive at different steps.
mod common;

use brook::model::config::ModelConfig;
use brook::model::loader::load_weights;
use brook::model::reference::reference_greedy;
use brook::request::StreamEvent;
use brook::sampling::params::RawSamplingParams;
use brook::validation::{GenerateRequest, PromptInput};
use common::testing::TestModelSpec;
use common::*;

const MAX_NEW: usize = 12;

async fn collect_text(mut rx: tokio::sync::mpsc::Receiver<StreamEvent>) -> (String, usize) {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            StreamEvent::Delta { text: t, .. } => text.push_str(&t),
            StreamEvent::Done { usage, .. } => return (text, usage.completion_tokens),
            StreamEvent::Error(e) => panic!("request failed: {e}"),
            StreamEvent::Started { .. } | StreamEvent::ChoiceDone { .. } => {}
        }
    }
    panic!("stream ended without a terminal event");
}

async fn check(spec: TestModelSpec) {
    let (_dir, path) = model_dir(&spec);
    let mut cfg = test_config();
    // A small budget and block size force chunked prefills that share steps with decodes.
    cfg.scheduler.max_num_batched_tokens = 24;
    cfg.scheduler.long_prefill_token_threshold = 16;
    cfg.cache.block_size = 4;
    let engine = start_engine(&cfg, &path);
    let config = ModelConfig::from_dir(&path).unwrap();
    let weights = load_weights(&path, &config, false).unwrap();

    let lengths = [3usize, 17, 40, 65, 9];
    let prompts: Vec<Vec<u32>> = lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| ((i * 131 + j * 37 + 5) % 250) as u32 + 3)
                .collect()
        })
        .collect();
    let submit = |p: &Vec<u32>| {
        let req = engine
            .validate(GenerateRequest {
                input: PromptInput::Tokens(p.clone()),
                params: RawSamplingParams {
                    max_tokens: Some(MAX_NEW as i64),
                    temperature: Some(0.0),
                    ignore_eos: Some(true),
                    ..Default::default()
                },
                n: None,
            })
            .unwrap();
        let (_, rx) = engine.submit(req);
        actix_rt::spawn(collect_text(rx))
    };
    // Two arrive at once; the others arrive while those are already decoding.
    let mut handles = vec![submit(&prompts[0]), submit(&prompts[1])];
    let mut rest = prompts[2..].iter();
    for p in rest.by_ref().take(2) {
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        handles.push(submit(p));
    }
    handles.extend(rest.map(submit));
    for (h, prompt) in handles.into_iter().zip(&prompts) {
        let (text, n) = h.await.unwrap();
        let (want_ids, _) = reference_greedy(&config, &weights, prompt, MAX_NEW).unwrap();
        assert_eq!(n, MAX_NEW);
        let want = engine.tokenizer.decode(&want_ids, true);
        assert!(!want.is_empty());
        assert_eq!(text, want, "prompt of {} tokens", prompt.len());
    }
}

#[actix_rt::test]
async fn engine_matches_reference_gqa_untied() {
    check(TestModelSpec::default()).await;
}

#[actix_rt::test]
async fn engine_matches_reference_mha_tied_llama3() {
    check(
        TestModelSpec::default()
            .heads(4, 4)
            .tied(true)
            .llama3_rope(true),
    )
    .await;
}
