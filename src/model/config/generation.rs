//! `generation_config.json`: the model's end tokens and default sampling.

use std::path::Path;

use serde::Deserialize;

use super::{parse_error, read_file, token_ids, TokenIds};
use crate::model::ModelError;

/// `generation_config.json`: the tokens that end generation and the model's default sampling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` as a number or a list; empty when absent.
    pub eos_token_ids: Vec<u32>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub max_new_tokens: Option<usize>,
    /// The default repetition penalty (`validation::ModelDefaults`).
    pub repetition_penalty: Option<f32>,
}

#[derive(Debug, Deserialize)]
struct RawGenerationConfig {
    bos_token_id: Option<u32>,
    eos_token_id: Option<TokenIds>,
    do_sample: Option<bool>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    max_new_tokens: Option<usize>,
    repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; `None` when the folder has none (it is optional).
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, ModelError> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(None);
        }
        Self::parse(&read_file(&path)?, &path).map(Some)
    }

    pub fn from_json_str(json: &str) -> Result<Self, ModelError> {
        Self::parse(json, Path::new("<generation_config.json string>"))
    }

    fn parse(json: &str, path: &Path) -> Result<Self, ModelError> {
        let raw: RawGenerationConfig =
            serde_json::from_str(json).map_err(|e| parse_error(path, e))?;
        Ok(GenerationConfig {
            bos_token_id: raw.bos_token_id,
            eos_token_ids: token_ids(raw.eos_token_id),
            do_sample: raw.do_sample,
            temperature: raw.temperature,
            top_p: raw.top_p,
            top_k: raw.top_k,
            min_p: raw.min_p,
            max_new_tokens: raw.max_new_tokens,
            repetition_penalty: raw.repetition_penalty,
        })
    }
}
