//! Validated per-request sampling parameters. A field the request leaves out takes the model's
//! default (its generation_config.json, see `validation::ModelDefaults`), else brook's
//! (`SamplingParams::default()`), as in vLLM and TGI.

use serde::Deserialize;

use crate::error::EngineError;

/// Parameters as they arrive in a `generate` frame's `params` object. Unknown fields are rejected
/// so that a typo never silently falls back to a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSamplingParams {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Option<Vec<String>>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    /// false opts this request out of speculative decoding (the server's `--speculative`).
    pub speculative: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub max_tokens: usize,
    /// 0.0 means greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    pub min_p: f32,
    /// Same seed and params give the same output whatever else shares the batch.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Whether the request may be decoded speculatively when the server speculates (it never
    /// changes the output distribution; off, a seeded request's tokens never depend on the
    /// speculation depth the load allows).
    pub speculative: bool,
}

pub const DEFAULT_MAX_TOKENS: usize = 256;
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_STRING_LEN: usize = 256;

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_tokens: DEFAULT_MAX_TOKENS,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            speculative: true,
        }
    }
}

impl SamplingParams {
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams {
            max_tokens,
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks every field; the error message names the offending field and value. Fields `raw`
    /// leaves out come from `defaults` (`seed`, `stop`, `stop_token_ids` and `ignore_eos` are
    /// per request only: brook's defaults).
    pub fn from_raw(
        raw: RawSamplingParams,
        defaults: &SamplingParams,
        vocab_size: usize,
    ) -> Result<Self, EngineError> {
        let d = defaults;
        let max_tokens = match raw.max_tokens {
            None => d.max_tokens,
            Some(n) if (1..=1 << 20).contains(&n) => n as usize,
            Some(n) => {
                return Err(EngineError::invalid(format!(
                    "params.max_tokens must be between 1 and 1048576, got {n}"
                )))
            }
        };
        let temperature = match raw.temperature {
            None => d.temperature,
            Some(t) if t.is_finite() && (0.0..=100.0).contains(&t) => t as f32,
            Some(t) => {
                return Err(EngineError::invalid(format!(
                    "params.temperature must be in [0, 100], got {t}"
                )))
            }
        };
        let top_p = match raw.top_p {
            None => d.top_p,
            // Checked after the cast: a tiny positive f64 would round to an f32 top_p of 0.
            Some(p) if p.is_finite() && p as f32 > 0.0 && p <= 1.0 => p as f32,
            Some(p) => {
                return Err(EngineError::invalid(format!(
                    "params.top_p must be in (0, 1], got {p}"
                )))
            }
        };
        let top_k = match raw.top_k {
            None => d.top_k,
            Some(k) if k >= 0 => k as usize,
            Some(k) => {
                return Err(EngineError::invalid(format!(
                    "params.top_k must be >= 0 (0 disables it), got {k}"
                )))
            }
        };
        let min_p = match raw.min_p {
            None => d.min_p,
            Some(p) if p.is_finite() && (0.0..=1.0).contains(&p) => p as f32,
            Some(p) => {
                return Err(EngineError::invalid(format!(
                    "params.min_p must be in [0, 1], got {p}"
                )))
            }
        };
        let stop = raw.stop.unwrap_or_default();
        if stop.len() > MAX_STOP_STRINGS {
            return Err(EngineError::invalid(format!(
                "params.stop has {} strings; at most {MAX_STOP_STRINGS} are allowed",
                stop.len()
            )));
        }
        for s in &stop {
            if s.is_empty() || s.len() > MAX_STOP_STRING_LEN {
                return Err(EngineError::invalid(format!(
                    "params.stop strings must be 1 to {MAX_STOP_STRING_LEN} bytes long, got {:?}",
                    s
                )));
            }
        }
        let stop_token_ids = raw.stop_token_ids.unwrap_or_default();
        if let Some(bad) = stop_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(EngineError::invalid(format!(
                "params.stop_token_ids contains {bad}, outside the vocabulary of {vocab_size}"
            )));
        }
        Ok(SamplingParams {
            max_tokens,
            temperature,
            top_p,
            top_k,
            min_p,
            seed: raw.seed,
            stop,
            stop_token_ids,
            ignore_eos: raw.ignore_eos.unwrap_or(false),
            speculative: raw.speculative.unwrap_or(true),
        })
    }
}
