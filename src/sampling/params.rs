//! Validated per-request sampling parameters. A field the request leaves out takes the model's
//! default (its generation_config.json, see `validation::ModelDefaults`), else brook's
//! (`SamplingParams::default()`), as in vLLM and TGI.

use std::collections::BTreeMap;

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
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// Token id (a JSON object key, so a string) → bias added to its logit.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    pub min_tokens: Option<i64>,
    /// Log-probabilities of this many most likely tokens per output token, besides the sampled
    /// token's own (vLLM's `logprobs`).
    pub logprobs: Option<i64>,
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
    /// Subtracted once from the logit of every token the output holds (0: off).
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output (0: off).
    pub frequency_penalty: f32,
    /// Divides positive logits and multiplies negative ones of tokens in the prompt or the
    /// output (1: off).
    pub repetition_penalty: f32,
    /// (token id, bias added to its logit), sorted by id, ids distinct.
    pub logit_bias: Vec<(u32, f32)>,
    /// Output tokens before eos or a stop token id (or stop string) may end the request.
    pub min_tokens: usize,
    /// Ids masked while fewer than `min_tokens` tokens were generated: `stop_token_ids` and,
    /// unless `ignore_eos`, the model's eos ids (validation adds those). Sorted, distinct.
    pub min_tokens_blocked: Vec<u32>,
    /// Some(k): report each output token's log-probability and the k most likely tokens'.
    pub logprobs: Option<usize>,
}

pub const DEFAULT_MAX_TOKENS: usize = 256;
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_STRING_LEN: usize = 256;
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// Entries of `logit_bias`; bounds the per-step upload of the CUDA sampler.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Most top log-probabilities per token (OpenAI's `top_logprobs` limit).
pub const MAX_LOGPROBS: usize = 20;

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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            min_tokens: 0,
            min_tokens_blocked: Vec::new(),
            logprobs: None,
        }
    }
}

/// A float field: the default when absent, else the value if finite and `ok`, else an error
/// naming the field and `range`.
fn float(
    v: Option<f64>,
    default: f32,
    name: &str,
    range: &str,
    ok: impl Fn(f64) -> bool,
) -> Result<f32, EngineError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && ok(x) => Ok(x as f32),
        Some(x) => Err(EngineError::invalid(format!(
            "params.{name} must be in {range}, got {x}"
        ))),
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

    /// Whether presence, frequency or repetition penalties apply: the executor then keeps the
    /// request's token counts.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Whether the min_tokens mask applies to output token `output_index`.
    pub fn masks_stop_ids(&self, output_index: usize) -> bool {
        output_index < self.min_tokens && !self.min_tokens_blocked.is_empty()
    }

    /// Whether anything changes the logits before temperature and the cuts for output token
    /// `output_index`: logit bias, the min_tokens mask or penalties.
    pub fn processes_logits(&self, output_index: usize) -> bool {
        !self.logit_bias.is_empty() || self.masks_stop_ids(output_index) || self.has_penalties()
    }

    /// Whether the request may be decoded speculatively when the server speculates: opted in
    /// (`speculative`), and none of penalties, logit bias, `min_tokens` or `logprobs`. Draft
    /// verification (`sampling::rejection`) samples from the target's plain distribution at
    /// each position; those features change it per position (penalties count the accepted
    /// drafts, the min_tokens mask moves with the output index) or report per token, so such a
    /// request decodes one token per step (depth 0) and keeps their exact semantics.
    pub fn may_speculate(&self) -> bool {
        self.speculative
            && !self.has_penalties()
            && self.logit_bias.is_empty()
            && self.min_tokens == 0
            && self.logprobs.is_none()
    }

    /// Checks every field; the error message names the offending field and value. Fields `raw`
    /// leaves out come from `defaults` (`seed`, `stop`, `stop_token_ids`, `ignore_eos`,
    /// `logit_bias`, `min_tokens` and `logprobs` are per request only: brook's defaults).
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
        let temperature = float(
            raw.temperature,
            d.temperature,
            "temperature",
            "[0, 100]",
            |t| (0.0..=100.0).contains(&t),
        )?;
        // Checked after the cast: a tiny positive f64 would round to an f32 top_p of 0.
        let top_p = float(raw.top_p, d.top_p, "top_p", "(0, 1]", |p| {
            p as f32 > 0.0 && p <= 1.0
        })?;
        let top_k = match raw.top_k {
            None => d.top_k,
            Some(k) if k >= 0 => k as usize,
            Some(k) => {
                return Err(EngineError::invalid(format!(
                    "params.top_k must be >= 0 (0 disables it), got {k}"
                )))
            }
        };
        let min_p = float(raw.min_p, d.min_p, "min_p", "[0, 1]", |p| {
            (0.0..=1.0).contains(&p)
        })?;
        let penalty =
            |v, default, name| float(v, default, name, "[-2, 2]", |p| (-2.0..=2.0).contains(&p));
        let presence_penalty =
            penalty(raw.presence_penalty, d.presence_penalty, "presence_penalty")?;
        let frequency_penalty = penalty(
            raw.frequency_penalty,
            d.frequency_penalty,
            "frequency_penalty",
        )?;
        let repetition_penalty = float(
            raw.repetition_penalty,
            d.repetition_penalty,
            "repetition_penalty",
            "(0, 100]",
            // As top_p: a tiny positive value must not round to a divisor of 0.
            |p| p as f32 > 0.0 && p <= 100.0,
        )?;
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
        if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(EngineError::invalid(format!(
                "params.stop_token_ids has {} ids; at most {MAX_STOP_TOKEN_IDS} are allowed",
                stop_token_ids.len()
            )));
        }
        if let Some(bad) = stop_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(EngineError::invalid(format!(
                "params.stop_token_ids contains {bad}, outside the vocabulary of {vocab_size}"
            )));
        }
        let logit_bias = parse_logit_bias(raw.logit_bias.unwrap_or_default(), vocab_size)?;
        let min_tokens = match raw.min_tokens {
            None => 0,
            Some(n) if n >= 0 && n as u64 <= max_tokens as u64 => n as usize,
            Some(n) => {
                return Err(EngineError::invalid(format!(
                    "params.min_tokens must be between 0 and max_tokens ({max_tokens}), got {n}"
                )))
            }
        };
        let logprobs = match raw.logprobs {
            None => None,
            Some(n) if (0..=MAX_LOGPROBS as i64).contains(&n) => Some(n as usize),
            Some(n) => {
                return Err(EngineError::invalid(format!(
                    "params.logprobs must be between 0 and {MAX_LOGPROBS}, got {n}"
                )))
            }
        };
        let mut min_tokens_blocked = stop_token_ids.clone();
        min_tokens_blocked.sort_unstable();
        min_tokens_blocked.dedup();
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
            presence_penalty,
            frequency_penalty,
            repetition_penalty,
            logit_bias,
            min_tokens,
            min_tokens_blocked,
            logprobs,
        })
    }

    /// The min_tokens mask also covers `eos` (the model's eos ids) unless `ignore_eos`.
    pub fn block_eos_before_min_tokens(&mut self, eos: &[u32]) {
        if self.ignore_eos || self.min_tokens == 0 {
            return;
        }
        self.min_tokens_blocked.extend_from_slice(eos);
        self.min_tokens_blocked.sort_unstable();
        self.min_tokens_blocked.dedup();
    }
}

fn parse_logit_bias(
    raw: BTreeMap<String, f64>,
    vocab_size: usize,
) -> Result<Vec<(u32, f32)>, EngineError> {
    if raw.len() > MAX_LOGIT_BIAS {
        return Err(EngineError::invalid(format!(
            "params.logit_bias has {} entries; at most {MAX_LOGIT_BIAS} are allowed",
            raw.len()
        )));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (key, bias) in raw {
        let id = key
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < vocab_size)
            .ok_or_else(|| {
                EngineError::invalid(format!(
                    "params.logit_bias keys must be token ids below the vocabulary size {vocab_size}, got {key:?}"
                ))
            })?;
        if !(bias.is_finite() && (-100.0..=100.0).contains(&bias)) {
            return Err(EngineError::invalid(format!(
                "params.logit_bias values must be in [-100, 100], got {bias} for token {id}"
            )));
        }
        out.push((id, bias as f32));
    }
    // Keys like "7" and "07" name one token: refuse rather than pick one.
    out.sort_unstable_by_key(|e| e.0);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(EngineError::invalid(format!(
            "params.logit_bias names token {} twice",
            w[0].0
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<SamplingParams, EngineError> {
        let raw: RawSamplingParams = serde_json::from_str(json).unwrap();
        SamplingParams::from_raw(raw, &SamplingParams::default(), 100)
    }

    fn err(json: &str) -> String {
        parse(json).unwrap_err().to_string()
    }

    #[test]
    fn penalties_bias_min_tokens_and_logprobs_parse() {
        let p = parse(
            r#"{"presence_penalty":0.5,"frequency_penalty":-1,"repetition_penalty":1.2,
                "logit_bias":{"9":-100,"3":2.5},"min_tokens":4,"max_tokens":10,"logprobs":5,
                "stop_token_ids":[7,5,7]}"#,
        )
        .unwrap();
        assert_eq!(
            (
                p.presence_penalty,
                p.frequency_penalty,
                p.repetition_penalty
            ),
            (0.5, -1.0, 1.2)
        );
        assert_eq!(p.logit_bias, vec![(3, 2.5), (9, -100.0)]);
        assert_eq!((p.min_tokens, p.logprobs), (4, Some(5)));
        assert_eq!(p.min_tokens_blocked, vec![5, 7]);
        assert!(p.has_penalties() && p.processes_logits(9) && p.masks_stop_ids(3));
        assert!(!p.masks_stop_ids(4));
        let d = SamplingParams::default();
        assert!(!d.has_penalties() && !d.processes_logits(0));
    }

    #[test]
    fn eos_joins_the_min_tokens_mask_unless_ignored() {
        let mut p = parse(r#"{"min_tokens":2,"stop_token_ids":[9]}"#).unwrap();
        p.block_eos_before_min_tokens(&[2, 9]);
        assert_eq!(p.min_tokens_blocked, vec![2, 9]);
        let mut p = parse(r#"{"min_tokens":2,"ignore_eos":true}"#).unwrap();
        p.block_eos_before_min_tokens(&[2]);
        assert!(p.min_tokens_blocked.is_empty());
    }

    #[test]
    fn out_of_range_values_name_the_field() {
        assert!(err(r#"{"presence_penalty":2.5}"#).contains("params.presence_penalty"));
        assert!(err(r#"{"frequency_penalty":-3}"#).contains("params.frequency_penalty"));
        assert!(err(r#"{"repetition_penalty":0}"#).contains("params.repetition_penalty"));
        assert!(err(r#"{"logit_bias":{"100":1}}"#).contains("logit_bias keys"));
        assert!(err(r#"{"logit_bias":{"x":1}}"#).contains("logit_bias keys"));
        assert!(err(r#"{"logit_bias":{"1":101}}"#).contains("[-100, 100]"));
        assert!(err(r#"{"logit_bias":{"1":1,"01":2}}"#).contains("twice"));
        assert!(err(r#"{"min_tokens":11,"max_tokens":10}"#).contains("params.min_tokens"));
        assert!(err(r#"{"min_tokens":-1}"#).contains("params.min_tokens"));
        assert!(err(r#"{"logprobs":21}"#).contains("params.logprobs"));
        let many: Vec<u32> = (0..65).collect();
        assert!(err(&format!(r#"{{"stop_token_ids":{many:?}}}"#)).contains("at most 64"));
    }
}
