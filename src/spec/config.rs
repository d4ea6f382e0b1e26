//! `[speculative]` in the config file, and the `--speculative` / `--draft-model` flags.

use std::path::PathBuf;

use serde::Deserialize;

/// How drafts are proposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SpecMethod {
    /// No speculative decoding.
    #[default]
    Off,
    /// N-gram prompt lookup: the tokens that followed the last earlier occurrence of the
    /// request's last n tokens (no extra model).
    Ngram,
    /// A small draft model (`draft_model`) on the same executor, with its own KV.
    Draft,
}

impl SpecMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            SpecMethod::Off => "off",
            SpecMethod::Ngram => "ngram",
            SpecMethod::Draft => "draft",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpecConfig {
    pub method: SpecMethod,
    /// Hugging Face folder of the draft model (`method = "draft"`); its tokenizer must equal
    /// the target's.
    pub draft_model: Option<PathBuf>,
    /// Most draft tokens per request and step: the ceiling of the adaptive depth k.
    pub max_depth: usize,
    /// Choose each step's depth by the cost model and acceptance (true), or always give
    /// `max_depth` within the pressure and emergency rules (false: benchmarks, tests).
    pub adaptive: bool,
    /// N-gram lookup: the longest and shortest suffix matched, in tokens (longest first).
    pub ngram_max: usize,
    pub ngram_min: usize,
    /// Speculation is off while more than this fraction of the KV blocks is in use.
    pub max_kv_usage: f64,
    /// Depth ceiling in emergency mode (adaptive policy).
    pub emergency_max_depth: usize,
    /// Per-token acceptance assumed for a request before its own drafts are verified.
    pub acceptance_prior: f64,
    /// Weight of one step in a request's acceptance estimate (exponential moving average).
    pub acceptance_ema: f64,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            method: SpecMethod::Off,
            draft_model: None,
            max_depth: 4,
            adaptive: true,
            ngram_max: 4,
            ngram_min: 2,
            max_kv_usage: 0.6,
            emergency_max_depth: 1,
            acceptance_prior: 0.7,
            acceptance_ema: 0.2,
        }
    }
}

/// Longest draft a request may get in one step (bounds buffers sized at start).
pub const MAX_DEPTH_LIMIT: usize = 16;

impl SpecConfig {
    pub fn enabled(&self) -> bool {
        self.method != SpecMethod::Off
    }

    /// The message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.enabled() && !(1..=MAX_DEPTH_LIMIT).contains(&self.max_depth) {
            return Err(format!(
                "speculative.max_depth must be 1 to {MAX_DEPTH_LIMIT}, got {}",
                self.max_depth
            ));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return Err(format!(
                "speculative: need 1 <= ngram_min <= ngram_max, got {} and {}",
                self.ngram_min, self.ngram_max
            ));
        }
        if !(0.0..=1.0).contains(&self.max_kv_usage) {
            return Err("speculative.max_kv_usage must be in [0, 1]".into());
        }
        if !(self.acceptance_prior > 0.0 && self.acceptance_prior < 1.0) {
            return Err("speculative.acceptance_prior must be in (0, 1)".into());
        }
        if !(self.acceptance_ema > 0.0 && self.acceptance_ema <= 1.0) {
            return Err("speculative.acceptance_ema must be in (0, 1]".into());
        }
        match (self.method, &self.draft_model) {
            (SpecMethod::Draft, None) => Err(
                "speculative.method = \"draft\" needs speculative.draft_model (--draft-model DIR)"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// Depth ceiling of the adaptive policy: 0 when off.
    pub fn depth_ceiling(&self) -> usize {
        if self.enabled() {
            self.max_depth
        } else {
            0
        }
    }
}
