//! Tests of the test-model writer (`testing.rs`), compiled with the library's unit tests only.

use std::collections::HashMap;

use candle_core::Tensor;

use super::testing::*;
use crate::model::config::ModelConfig;
use crate::model::synthetic::random_weights;
use tokenizers::Tokenizer;

#[test]
fn writes_a_complete_model_folder_that_parses() {
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &TestModelSpec::default()).unwrap();
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let tok = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    assert_eq!(config.vocab_size, tok.get_vocab_size(true));
    assert!(
        config.vocab_size > 256 + SPECIAL_TOKENS.len() + 100,
        "merges learned: {}",
        config.vocab_size
    );
    let gen = crate::model::config::GenerationConfig::from_dir(dir.path())
        .unwrap()
        .unwrap();
    let ids: Vec<u32> = [EOS_TOKEN, END_OF_TURN_TOKEN]
        .iter()
        .map(|t| tok.token_to_id(t).unwrap())
        .collect();
    assert_eq!(gen.eos_token_ids, ids);
    assert_eq!(config.eos_token_ids, vec![ids[0]]);
    let tc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(tc["chat_template"], CHAT_TEMPLATE);
}

#[test]
fn tokenizer_round_trips_text_and_keeps_special_tokens_whole() {
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &TestModelSpec::default()).unwrap();
    let tok = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let text = "The brook runs to the sea. Ünïcödé ✓ 🙂";
    let enc = tok.encode(text, true).unwrap();
    assert_eq!(enc.get_ids()[0], tok.token_to_id(BOS_TOKEN).unwrap());
    // Merges make common words shorter than their bytes.
    assert!(enc.get_ids().len() < text.len());
    assert_eq!(tok.decode(enc.get_ids(), true).unwrap(), text);
    let chat = tok.encode("<|user|>\nhi<|end|>\n", false).unwrap();
    assert_eq!(chat.get_ids()[0], tok.token_to_id("<|user|>").unwrap());
    assert!(chat
        .get_ids()
        .contains(&tok.token_to_id(END_OF_TURN_TOKEN).unwrap()));
}

#[test]
fn same_seed_same_weights_other_seed_other_weights() {
    let config =
        ModelConfig::from_json_str(&TestModelSpec::default().config_json(300, 0, 1).to_string())
            .unwrap();
    let a = random_weights(&config, 1).unwrap();
    let b = random_weights(&config, 1).unwrap();
    let c = random_weights(&config, 2).unwrap();
    let name = "model.layers.1.mlp.down_proj.weight";
    let v = |w: &HashMap<String, Tensor>| w[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(v(&a), v(&b));
    assert_ne!(v(&a), v(&c));
}
