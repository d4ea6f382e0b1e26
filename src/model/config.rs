//! `config.json` and `generation_config.json` of a Hugging Face checkpoint of the Llama family
//! (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, Phi-3; the differences are in `model::arch`).
//!
//! Fields are read as transformers writes them, including both RoPE spellings: the classic
//! top-level `rope_theta` + `rope_scaling`, and the transformers-5 `rope_parameters` block (which
//! carries `rope_theta` inside). Anything brook cannot run exactly (another architecture, another
//! activation, a RoPE variant it does not implement) is an error naming the field and value, never
//! a silent approximation.

use std::f64::consts::PI;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::model::ModelError;

pub use crate::model::arch::Architecture;

/// Storage dtype of a checkpoint's weights (`torch_dtype` / `dtype`). Compute is always f32 on CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDType {
    F32,
    F16,
    BF16,
}

impl WeightDType {
    pub fn hf_name(self) -> &'static str {
        match self {
            WeightDType::F32 => "float32",
            WeightDType::F16 => "float16",
            WeightDType::BF16 => "bfloat16",
        }
    }

    pub fn size_in_bytes(self) -> usize {
        match self {
            WeightDType::F32 => 4,
            WeightDType::F16 | WeightDType::BF16 => 2,
        }
    }

    pub fn to_candle(self) -> candle_core::DType {
        match self {
            WeightDType::F32 => candle_core::DType::F32,
            WeightDType::F16 => candle_core::DType::F16,
            WeightDType::BF16 => candle_core::DType::BF16,
        }
    }

    fn from_hf_name(field: &str, name: &str) -> Result<Self, ModelError> {
        match name {
            "float32" => Ok(WeightDType::F32),
            "float16" => Ok(WeightDType::F16),
            "bfloat16" => Ok(WeightDType::BF16),
            other => Err(ModelError::unsupported(field, other)),
        }
    }
}

/// How RoPE frequencies are rescaled for long context.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `rope_type: "default"` or no scaling block.
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// Phi-3's `longrope` (alias `su`) within its original context: every frequency divided by
    /// its `short_factor`, and cos/sin multiplied by `attention_factor`. transformers switches to
    /// `long_factor` once a sequence passes `original_max_position_embeddings`; brook serves only
    /// up to there (the config's context is clamped, with a warning), where this is exact.
    LongRope {
        short_factor: Vec<f64>,
        attention_factor: f64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// Factor on cos and sin (longrope's attention scaling; 1 for the others).
    pub fn attention_factor(&self) -> f64 {
        match self.scaling {
            RopeScaling::LongRope {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// Inverse frequencies of the `head_dim / 2` rotated pairs, scaling applied; the same formulas
    /// as transformers' `ROPE_INIT_FUNCTIONS`, computed in f64.
    pub fn inv_freqs(&self, head_dim: usize) -> Vec<f64> {
        debug_assert!(
            !matches!(&self.scaling, RopeScaling::LongRope { short_factor, .. } if short_factor.len() != head_dim / 2),
            "longrope factors were checked against head_dim at parse"
        );
        let base =
            (0..head_dim / 2).map(|i| 1.0 / self.theta.powf((2 * i) as f64 / head_dim as f64));
        match self.scaling {
            RopeScaling::None => base.collect(),
            RopeScaling::Linear { factor } => base.map(|f| f / factor).collect(),
            RopeScaling::LongRope {
                ref short_factor, ..
            } => base.zip(short_factor).map(|(f, s)| f / s).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old_len = original_max_position_embeddings as f64;
                let low_freq_wavelen = old_len / low_freq_factor;
                let high_freq_wavelen = old_len / high_freq_factor;
                base.map(|f| {
                    let wavelen = 2.0 * PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_len / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Equal to `num_attention_heads` for MHA, fewer for GQA, 1 for MQA.
    pub num_key_value_heads: usize,
    /// Explicit `head_dim`, else `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    /// The longest context brook serves: config.json's, except under longrope, where it is
    /// clamped to `original_max_position_embeddings` (see `RopeScaling::LongRope`).
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Bias on the q, k and v projections (Qwen2 always; Llama and Qwen3 under `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the o projection (Llama and Qwen3 under `attention_bias`).
    pub o_bias: bool,
    /// Bias on gate/up/down projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm over each query and key head before RoPE, with weights `q_norm`/`k_norm` of
    /// `[head_dim]` (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` as a number or a list; empty when absent.
    pub eos_token_ids: Vec<u32>,
    pub torch_dtype: Option<WeightDType>,
    /// Sliding-window attention: a query at position p sees keys p - w + 1 ..= p (transformers'
    /// `kv_idx > q_idx - sliding_window`). `None` when the family does not use the field (Llama;
    /// Qwen without `use_sliding_window`) or the window covers the whole context.
    pub sliding_window: Option<usize>,
    pub rope: RopeConfig,
}

/// A token id field that transformers writes as a number or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

fn token_ids(ids: Option<TokenIds>) -> Vec<u32> {
    match ids {
        None => Vec::new(),
        Some(TokenIds::One(id)) => vec![id],
        Some(TokenIds::Many(ids)) => ids,
    }
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: usize,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<TokenIds>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    /// Outer None: the key is absent (the family's default applies); inner None: `null`.
    #[serde(default, deserialize_with = "present")]
    sliding_window: Option<Option<usize>>,
    use_sliding_window: Option<bool>,
    layer_types: Option<Vec<String>>,
    partial_rotary_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    hidden_act: Option<String>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRope>,
    rope_parameters: Option<RawRope>,
}

/// `rope_scaling` (classic) or `rope_parameters` (transformers 5); the latter also holds the theta.
#[derive(Debug, Deserialize)]
struct RawRope {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    partial_rotary_factor: Option<f64>,
    short_factor: Option<Vec<f64>>,
    long_factor: Option<Vec<f64>>,
    attention_factor: Option<f64>,
}

/// Deserializes a key that is present (as a value or `null`) to `Some`; absent keys get
/// `#[serde(default)]`'s `None`.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// What a RoPE block's scaling needs from the rest of config.json.
struct RopeContext {
    head_dim: usize,
    max_position_embeddings: usize,
    /// Top-level `original_max_position_embeddings` (Phi-3 writes it there).
    original_max_position_embeddings: Option<usize>,
}

const DEFAULT_ROPE_THETA: f64 = 10_000.0;
/// transformers' LlamaConfig default.
const DEFAULT_RMS_NORM_EPS: f64 = 1e-6;

impl RawRope {
    fn scaling(&self, block: &str, ctx: &RopeContext) -> Result<RopeScaling, ModelError> {
        let kind = self
            .rope_type
            .as_deref()
            .or(self.legacy_type.as_deref())
            .unwrap_or("default");
        if let Some(p) = self.partial_rotary_factor.filter(|&p| p != 1.0) {
            return Err(ModelError::unsupported(
                format!("{block}.partial_rotary_factor"),
                p,
            ));
        }
        let need = |v: Option<f64>, name: &str| {
            v.ok_or_else(|| {
                ModelError::Invalid(format!("{block}.{name} is required for rope_type {kind:?}"))
            })
        };
        match kind {
            "default" => Ok(RopeScaling::None),
            "linear" => Ok(RopeScaling::Linear {
                factor: need(self.factor, "factor")?,
            }),
            "llama3" => {
                let scaling = RopeScaling::Llama3 {
                    factor: need(self.factor, "factor")?,
                    low_freq_factor: need(self.low_freq_factor, "low_freq_factor")?,
                    high_freq_factor: need(self.high_freq_factor, "high_freq_factor")?,
                    original_max_position_embeddings: self.original_max_position_embeddings.ok_or_else(|| {
                        ModelError::Invalid(format!("{block}.original_max_position_embeddings is required for rope_type \"llama3\""))
                    })?,
                };
                if let RopeScaling::Llama3 {
                    low_freq_factor: lo,
                    high_freq_factor: hi,
                    ..
                } = scaling
                {
                    if hi <= lo {
                        return Err(ModelError::Invalid(format!(
                            "{block}: high_freq_factor {hi} must exceed low_freq_factor {lo}"
                        )));
                    }
                }
                Ok(scaling)
            }
            "longrope" | "su" => self.longrope(block, ctx),
            other => Err(ModelError::unsupported(format!("{block}.rope_type"), other)),
        }
    }

    /// transformers' `_compute_longrope_parameters` at sequence lengths within the original
    /// context: the short factors, and the attention factor from the context ratio.
    fn longrope(&self, block: &str, ctx: &RopeContext) -> Result<RopeScaling, ModelError> {
        let short_factor = self.short_factor.clone().ok_or_else(|| {
            ModelError::Invalid(format!("{block}.short_factor is required for longrope"))
        })?;
        let half = ctx.head_dim / 2;
        for (name, f) in [
            ("short_factor", Some(&short_factor)),
            ("long_factor", self.long_factor.as_ref()),
        ] {
            if let Some(f) = f.filter(|f| f.len() != half) {
                return Err(ModelError::Invalid(format!(
                    "{block}.{name} has {} entries; head_dim {} needs {half}",
                    f.len(),
                    ctx.head_dim
                )));
            }
        }
        if short_factor.iter().any(|&f| !(f.is_finite() && f > 0.0)) {
            return Err(ModelError::Invalid(format!(
                "{block}.short_factor must be positive"
            )));
        }
        // Phi-3 keeps the pretrained context in original_max_position_embeddings; without a
        // `factor`, the scale is the ratio of the two contexts (transformers 5).
        let original = ctx
            .original_max_position_embeddings
            .or(self.original_max_position_embeddings)
            .unwrap_or(ctx.max_position_embeddings);
        let factor = self
            .factor
            .unwrap_or(ctx.max_position_embeddings as f64 / original as f64);
        let attention_factor = match self.attention_factor {
            Some(a) => a,
            None if factor <= 1.0 => 1.0,
            None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
        };
        Ok(RopeScaling::LongRope {
            short_factor,
            attention_factor,
        })
    }
}

/// The context longrope is served within (see `RopeScaling::LongRope`).
fn longrope_original_context(raw: &RawConfig) -> Option<usize> {
    let block = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref())?;
    raw.original_max_position_embeddings
        .or(block.original_max_position_embeddings)
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let json = read_file(&path)?;
        Self::parse(&json, &path)
    }

    pub fn from_json_str(json: &str) -> Result<Self, ModelError> {
        Self::parse(json, Path::new("<config.json string>"))
    }

    fn parse(json: &str, path: &Path) -> Result<Self, ModelError> {
        let raw: RawConfig = serde_json::from_str(json).map_err(|e| parse_error(path, e))?;
        let architecture = match (&raw.architectures, &raw.model_type) {
            (Some(archs), _) if !archs.is_empty() => Architecture::from_hf_name(&archs[0])
                .ok_or_else(|| ModelError::UnknownArchitecture(archs.join(",")))?,
            (_, Some(model_type)) => {
                Architecture::from_model_type(model_type).ok_or_else(|| {
                    ModelError::UnknownArchitecture(format!("model_type {model_type}"))
                })?
            }
            _ => {
                return Err(ModelError::UnknownArchitecture(
                    "<none: config.json has no architectures>".into(),
                ))
            }
        };
        if let Some(act) = raw.hidden_act.as_deref().filter(|&a| a != "silu") {
            return Err(ModelError::unsupported("hidden_act", act));
        }
        if let Some(p) = raw.partial_rotary_factor.filter(|&p| p != 1.0) {
            return Err(ModelError::unsupported("partial_rotary_factor", p));
        }
        let num_attention_heads = raw.num_attention_heads;
        let num_key_value_heads = raw.num_key_value_heads.unwrap_or(num_attention_heads);
        if num_attention_heads == 0
            || raw.hidden_size % num_attention_heads != 0 && raw.head_dim.is_none()
        {
            return Err(ModelError::Invalid(format!(
                "hidden_size {} is not divisible by num_attention_heads {num_attention_heads} and head_dim is not given",
                raw.hidden_size
            )));
        }
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / num_attention_heads);
        let rope_ctx = RopeContext {
            head_dim,
            max_position_embeddings: raw.max_position_embeddings,
            original_max_position_embeddings: raw.original_max_position_embeddings,
        };
        let rope = match (&raw.rope_parameters, &raw.rope_scaling) {
            // transformers 5 writes rope_parameters and may keep the legacy keys beside it; the
            // block is authoritative.
            (Some(params), _) => RopeConfig {
                theta: params
                    .rope_theta
                    .or(raw.rope_theta)
                    .unwrap_or(DEFAULT_ROPE_THETA),
                scaling: params.scaling("rope_parameters", &rope_ctx)?,
            },
            (None, Some(scaling)) => RopeConfig {
                theta: raw.rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
                scaling: scaling.scaling("rope_scaling", &rope_ctx)?,
            },
            (None, None) => RopeConfig {
                theta: raw.rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
                scaling: RopeScaling::None,
            },
        };
        let torch_dtype = match (raw.dtype.as_deref(), raw.torch_dtype.as_deref()) {
            (Some(d), _) => Some(WeightDType::from_hf_name("dtype", d)?),
            (None, Some(d)) => Some(WeightDType::from_hf_name("torch_dtype", d)?),
            (None, None) => None,
        };
        let mut max_position_embeddings = raw.max_position_embeddings;
        if let RopeScaling::LongRope { .. } = rope.scaling {
            if let Some(orig) =
                longrope_original_context(&raw).filter(|&o| o < max_position_embeddings)
            {
                tracing::warn!(
                    "longrope: serving up to original_max_position_embeddings {orig} of max_position_embeddings {max_position_embeddings} (the long_factor frequencies past it are not implemented)"
                );
                max_position_embeddings = orig;
            }
        }
        let sliding_window = architecture
            .sliding_window(
                raw.sliding_window,
                raw.use_sliding_window,
                raw.layer_types.as_deref(),
            )?
            .filter(|&w| w < max_position_embeddings);
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let biases = architecture.biases(attention_bias, raw.mlp_bias.unwrap_or(false));
        let config = ModelConfig {
            architecture,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(DEFAULT_RMS_NORM_EPS),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias: biases.qkv,
            o_bias: biases.o,
            mlp_bias: biases.mlp,
            qk_norm: architecture.qk_norm(),
            bos_token_id: raw.bos_token_id,
            eos_token_ids: token_ids(raw.eos_token_id),
            torch_dtype,
            sliding_window,
            rope,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ModelError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ModelError::Invalid(format!("{name} must be positive")));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(ModelError::Invalid(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.head_dim % 2 != 0 {
            return Err(ModelError::unsupported(
                "head_dim (RoPE needs it even)",
                self.head_dim,
            ));
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if self.sliding_window == Some(0) {
            return Err(ModelError::Invalid(
                "sliding_window must be positive".into(),
            ));
        }
        if !positive(self.rms_norm_eps) || !positive(self.rope.theta) {
            return Err(ModelError::Invalid(format!(
                "rms_norm_eps {} and rope theta {} must be positive",
                self.rms_norm_eps, self.rope.theta
            )));
        }
        for (field, id) in self
            .bos_token_id
            .iter()
            .map(|&b| ("bos_token_id", b))
            .chain(self.eos_token_ids.iter().map(|&e| ("eos_token_id", e)))
        {
            if id as usize >= self.vocab_size {
                return Err(ModelError::Invalid(format!(
                    "{field} {id} is outside the vocabulary of {}",
                    self.vocab_size
                )));
            }
        }
        Ok(())
    }

    /// Width of the concatenated query heads (may differ from hidden_size with explicit head_dim).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Parameters in the checkpoint (a tied lm_head is not counted twice).
    pub fn num_parameters(&self) -> usize {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let attn_bias = usize::from(self.qkv_bias) * (self.q_dim() + 2 * self.kv_dim())
            + usize::from(self.o_bias) * h;
        let qk_norm = usize::from(self.qk_norm) * 2 * self.head_dim;
        let attn =
            h * self.q_dim() + 2 * h * self.kv_dim() + self.q_dim() * h + attn_bias + qk_norm;
        let mlp = 3 * h * i + if self.mlp_bias { 2 * i + h } else { 0 };
        let layer = attn + mlp + 2 * h;
        let embed = self.vocab_size * h;
        let lm_head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        embed + self.num_hidden_layers * layer + h + lm_head
    }

    /// K and V of one token across all layers, at `dtype_bytes` per element.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> usize {
        2 * self.num_hidden_layers * self.kv_dim() * dtype_bytes
    }
}

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
    /// Read so it can be reported; brook's sampler has no repetition penalty yet.
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

pub(crate) fn read_file(path: &Path) -> Result<String, ModelError> {
    std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ModelError::MissingFile {
            path: path.to_path_buf(),
        },
        _ => ModelError::Io {
            path: path.to_path_buf(),
            source: e,
        },
    })
}

pub(crate) fn parse_error(path: &Path, e: serde_json::Error) -> ModelError {
    ModelError::Parse {
        path: PathBuf::from(path),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A valid Llama config; each test changes one thing.
    fn base() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 1000,
            "hidden_size": 256,
            "intermediate_size": 688,
            "num_hidden_layers": 3,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "torch_dtype": "bfloat16",
            "rope_theta": 500000.0
        })
    }

    fn with(f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Value {
        let mut v = base();
        f(v.as_object_mut().unwrap());
        v
    }

    fn parse(v: &Value) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_json_str(&v.to_string())
    }

    fn llama3_block() -> Value {
        json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192})
    }

    #[test]
    fn parses_a_llama_config_with_defaults() {
        let c = parse(&base()).unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!(c.head_dim, 32);
        assert_eq!(c.num_key_value_heads, 2);
        assert_eq!(
            c.rope,
            RopeConfig {
                theta: 500000.0,
                scaling: RopeScaling::None
            }
        );
        assert_eq!(c.eos_token_ids, vec![2]);
        assert_eq!(c.torch_dtype, Some(WeightDType::BF16));
        assert!(!c.tie_word_embeddings && !c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm);
    }

    #[test]
    fn classic_rope_keys_and_rope_parameters_agree() {
        let classic = parse(&with(|m| {
            m.insert("rope_scaling".into(), llama3_block());
        }))
        .unwrap();
        let mut block = llama3_block();
        block["rope_theta"] = json!(500000.0);
        let v5 = parse(&with(|m| {
            m.remove("rope_theta");
            m.insert("rope_parameters".into(), block);
        }))
        .unwrap();
        assert_eq!(classic.rope, v5.rope);
        assert!(
            matches!(classic.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0)
        );
        // The legacy "type" spelling of rope_scaling.
        let legacy = parse(&with(|m| {
            m.insert(
                "rope_scaling".into(),
                json!({"type": "linear", "factor": 2.0}),
            );
        }))
        .unwrap();
        assert_eq!(legacy.rope.scaling, RopeScaling::Linear { factor: 2.0 });
        // A default-type rope_parameters block is no scaling, with its own theta.
        let plain = parse(&with(|m| {
            m.remove("rope_theta");
            m.insert(
                "rope_parameters".into(),
                json!({"rope_type": "default", "rope_theta": 1234.0}),
            );
        }))
        .unwrap();
        assert_eq!(
            plain.rope,
            RopeConfig {
                theta: 1234.0,
                scaling: RopeScaling::None
            }
        );
    }

    #[test]
    fn llama3_inv_freqs_keep_high_divide_low_and_blend_between() {
        let rope = RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            },
        };
        let plain = RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::None,
        }
        .inv_freqs(16);
        let scaled = rope.inv_freqs(16);
        // Wavelengths 2π/f: 6.3 (< 64/4 kept), 19.9 and 62.8 (blended), ≥ 199 (> 64/1, divided).
        assert_eq!(scaled[0], plain[0]);
        for i in 1..=2 {
            assert!(
                scaled[i] < plain[i] && scaled[i] > plain[i] / 8.0,
                "pair {i}"
            );
        }
        for i in 3..8 {
            assert!((scaled[i] - plain[i] / 8.0).abs() < 1e-15, "pair {i}");
        }
        // Pair 1: wavelen = 2π·10^0.5 ≈ 19.87, smooth = (64/19.87 - 1)/3.
        let wavelen = 2.0 * PI / plain[1];
        let smooth = (64.0 / wavelen - 1.0) / 3.0;
        assert!((scaled[1] - ((1.0 - smooth) * plain[1] / 8.0 + smooth * plain[1])).abs() < 1e-15);
    }

    #[test]
    fn eos_as_number_or_list_and_null_bos() {
        let list = parse(&with(|m| {
            m.insert("eos_token_id".into(), json!([2, 7, 9]));
            m.insert("bos_token_id".into(), Value::Null);
        }))
        .unwrap();
        assert_eq!(list.eos_token_ids, vec![2, 7, 9]);
        assert_eq!(list.bos_token_id, None);
        let err = parse(&with(|m| {
            m.insert("eos_token_id".into(), json!(5000));
        }))
        .unwrap_err();
        assert!(err.to_string().contains("eos_token_id 5000"), "{err}");
    }

    #[test]
    fn mqa_mha_and_explicit_head_dim() {
        let mqa = parse(&with(|m| {
            m.insert("num_key_value_heads".into(), json!(1));
        }))
        .unwrap();
        assert_eq!((mqa.num_key_value_heads, mqa.kv_dim()), (1, 32));
        let mha = parse(&with(|m| {
            m.remove("num_key_value_heads");
        }))
        .unwrap();
        assert_eq!(mha.num_key_value_heads, 8);
        let explicit = parse(&with(|m| {
            m.insert("head_dim".into(), json!(64));
        }))
        .unwrap();
        assert_eq!(
            (explicit.head_dim, explicit.q_dim(), explicit.kv_dim()),
            (64, 512, 128)
        );
        let bad_gqa = parse(&with(|m| {
            m.insert("num_key_value_heads".into(), json!(3));
        }));
        assert!(bad_gqa
            .unwrap_err()
            .to_string()
            .contains("num_key_value_heads 3"));
    }

    #[test]
    fn unknown_architecture_is_named() {
        let err = parse(&with(|m| {
            m.insert("architectures".into(), json!(["GPT2LMHeadModel"]));
        }))
        .unwrap_err();
        assert!(
            matches!(&err, ModelError::UnknownArchitecture(a) if a == "GPT2LMHeadModel"),
            "{err}"
        );
        assert!(err.to_string().contains("GPT2LMHeadModel"));
        let mistral = parse(&with(|m| {
            m.insert("architectures".into(), json!(["MistralForCausalLM"]));
        }))
        .unwrap();
        assert_eq!(mistral.architecture, Architecture::Mistral);
    }

    #[test]
    fn unsupported_rope_type_activation_and_dtype_are_named() {
        let rope = parse(&with(|m| {
            m.insert(
                "rope_scaling".into(),
                json!({"rope_type": "yarn", "factor": 4.0}),
            );
        }))
        .unwrap_err();
        let msg = rope.to_string();
        assert!(
            msg.contains("rope_scaling.rope_type") && msg.contains("yarn"),
            "{msg}"
        );
        let v5 = parse(&with(|m| {
            m.insert(
                "rope_parameters".into(),
                json!({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
            );
        }))
        .unwrap_err();
        assert!(
            v5.to_string().contains("rope_parameters.rope_type")
                && v5.to_string().contains("dynamic")
        );
        let missing = parse(&with(|m| {
            m.insert(
                "rope_scaling".into(),
                json!({"rope_type": "llama3", "factor": 8.0}),
            );
        }))
        .unwrap_err();
        assert!(missing.to_string().contains("low_freq_factor"), "{missing}");
        let act = parse(&with(|m| {
            m.insert("hidden_act".into(), json!("gelu"));
        }))
        .unwrap_err();
        assert!(act.to_string().contains("hidden_act") && act.to_string().contains("gelu"));
        let dtype = parse(&with(|m| {
            m.insert("dtype".into(), json!("float8_e4m3fn"));
        }))
        .unwrap_err();
        assert!(dtype.to_string().contains("dtype") && dtype.to_string().contains("float8_e4m3fn"));
    }

    #[test]
    fn mistral_sliding_window_is_kept_not_clamped() {
        let windowed = parse(&with(|m| {
            m.insert("architectures".into(), json!(["MistralForCausalLM"]));
            m.insert("sliding_window".into(), json!(1024));
        }))
        .unwrap();
        assert_eq!(
            (windowed.max_position_embeddings, windowed.sliding_window),
            (4096, Some(1024))
        );
        let null = parse(&with(|m| {
            m.insert("architectures".into(), json!(["MistralForCausalLM"]));
            m.insert("sliding_window".into(), Value::Null);
        }))
        .unwrap();
        assert_eq!(null.sliding_window, None);
        // A window covering the whole context is no window.
        let wide = parse(&with(|m| {
            m.insert("architectures".into(), json!(["MistralForCausalLM"]));
            m.insert("sliding_window".into(), json!(4096));
        }))
        .unwrap();
        assert_eq!(wide.sliding_window, None);
        let zero = parse(&with(|m| {
            m.insert("architectures".into(), json!(["MistralForCausalLM"]));
            m.insert("sliding_window".into(), json!(0));
        }));
        assert!(zero.unwrap_err().to_string().contains("sliding_window"));
        // Llama has no window, whatever the file says.
        let llama = parse(&with(|m| {
            m.insert("sliding_window".into(), json!(1024));
        }))
        .unwrap();
        assert_eq!(llama.sliding_window, None);
    }

    /// Qwen2.5-7B-Instruct's config.json (transformers 4 spelling).
    fn qwen25_7b() -> Value {
        json!({
            "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
            "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584,
            "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
            "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
            "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
            "use_sliding_window": false, "vocab_size": 152064
        })
    }

    #[test]
    fn qwen2_has_qkv_bias_and_no_window_unless_asked() {
        let c = parse(&qwen25_7b()).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen2);
        assert!(c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm);
        assert_eq!(
            (c.head_dim, c.num_attention_heads / c.num_key_value_heads),
            (128, 7)
        );
        assert_eq!((c.sliding_window, c.max_position_embeddings), (None, 32768));
        assert!(
            (c.num_parameters() as f64 / 1e9 - 7.62).abs() < 0.01,
            "{}",
            c.num_parameters()
        );
        let mut sw = qwen25_7b();
        sw["use_sliding_window"] = json!(true);
        let err = parse(&sw).unwrap_err().to_string();
        assert!(err.contains("use_sliding_window"), "{err}");
    }

    #[test]
    fn qwen3_has_qk_norm_and_explicit_head_dim() {
        // Qwen3-0.6B's shape.
        let mut v = qwen25_7b();
        let m = v.as_object_mut().unwrap();
        for (k, x) in [
            ("architectures", json!(["Qwen3ForCausalLM"])),
            ("model_type", json!("qwen3")),
            ("hidden_size", json!(1024)),
            ("intermediate_size", json!(3072)),
            ("num_attention_heads", json!(16)),
            ("num_key_value_heads", json!(8)),
            ("head_dim", json!(128)),
            ("attention_bias", json!(false)),
            ("tie_word_embeddings", json!(true)),
            ("vocab_size", json!(151936)),
            ("num_hidden_layers", json!(28)),
        ] {
            m.insert(k.into(), x);
        }
        let c = parse(&v).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3);
        assert!(c.qk_norm && !c.qkv_bias && !c.o_bias);
        assert_eq!((c.q_dim(), c.hidden_size), (2048, 1024));
        assert!(
            (c.num_parameters() as f64 / 1e9 - 0.596).abs() < 0.001,
            "{}",
            c.num_parameters()
        );
    }

    /// Phi-3.5-mini-instruct's config.json, factors shortened to a 16-dim head.
    fn phi35(short: Value, long: Value) -> Value {
        json!({
            "architectures": ["Phi3ForCausalLM"], "bos_token_id": 1, "eos_token_id": 32000,
            "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 8192,
            "max_position_embeddings": 131072, "model_type": "phi3", "num_attention_heads": 4,
            "num_hidden_layers": 32, "num_key_value_heads": 4, "original_max_position_embeddings": 4096,
            "pad_token_id": 32000, "rms_norm_eps": 1e-05,
            "rope_scaling": {"long_factor": long, "short_factor": short, "type": "longrope"},
            "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "vocab_size": 32064
        })
    }

    #[test]
    fn phi3_longrope_serves_the_original_context_with_short_factors() {
        let short: Vec<f64> = (0..8).map(|i| 1.0 + i as f64 * 0.1).collect();
        let c = parse(&phi35(json!(short), json!(vec![4.0; 8]))).unwrap();
        assert_eq!(c.architecture, Architecture::Phi3);
        assert_eq!(c.max_position_embeddings, 4096);
        // The window (262144) is past the served context: no window.
        assert_eq!(c.sliding_window, None);
        let factor = (1.0 + (131072f64 / 4096.0).ln() / 4096f64.ln()).sqrt();
        assert!((c.rope.attention_factor() - factor).abs() < 1e-12);
        let plain = RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::None,
        }
        .inv_freqs(16);
        for (i, f) in c.rope.inv_freqs(16).iter().enumerate() {
            assert!((f - plain[i] / short[i]).abs() < 1e-15);
        }
        // The "su" alias, and the factor count checked against head_dim.
        let mut su = phi35(json!(short), json!(vec![4.0; 8]));
        su["rope_scaling"]["type"] = json!("su");
        assert!(matches!(
            parse(&su).unwrap().rope.scaling,
            RopeScaling::LongRope { .. }
        ));
        let err = parse(&phi35(json!(vec![1.0; 7]), json!(vec![4.0; 8]))).unwrap_err();
        assert!(
            err.to_string().contains("short_factor has 7 entries"),
            "{err}"
        );
        // Phi-4-mini's partial rotary factor is refused by name.
        let mut partial = phi35(json!(short), json!(vec![4.0; 8]));
        partial["partial_rotary_factor"] = json!(0.75);
        let err = parse(&partial).unwrap_err().to_string();
        assert!(
            err.contains("partial_rotary_factor") && err.contains("0.75"),
            "{err}"
        );
    }

    #[test]
    fn missing_file_and_parse_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = ModelConfig::from_dir(dir.path()).unwrap_err();
        assert!(
            matches!(&err, ModelError::MissingFile { path } if path == &dir.path().join("config.json"))
        );
        assert!(err.to_string().contains("config.json"));
        std::fs::write(dir.path().join("config.json"), "{\"vocab_size\": 10}").unwrap();
        let err = ModelConfig::from_dir(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("config.json") && msg.contains("hidden_size"),
            "{msg}"
        );
    }

    #[test]
    fn parameter_count_and_kv_bytes() {
        let c = parse(&base()).unwrap();
        // embed 1000·256; per layer q 256·256, k,v 256·64 each, o 256·256, mlp 3·256·688, norms 2·256.
        let layer = 2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 688 + 2 * 256;
        assert_eq!(c.num_parameters(), 2 * 1000 * 256 + 3 * layer + 256);
        assert_eq!(c.kv_bytes_per_token(2), 2 * 3 * 64 * 2);
    }

    #[test]
    fn generation_config_reads_eos_list_and_sampling_defaults() {
        let g = GenerationConfig::from_json_str(r#"{"bos_token_id": 1, "eos_token_id": [2, 5], "temperature": 0.6, "top_p": 0.9, "do_sample": true}"#)
            .unwrap();
        assert_eq!(g.eos_token_ids, vec![2, 5]);
        assert_eq!(
            (g.temperature, g.top_p, g.top_k),
            (Some(0.6), Some(0.9), None)
        );
        let single = GenerationConfig::from_json_str(r#"{"eos_token_id": 3}"#).unwrap();
        assert_eq!(single.eos_token_ids, vec![3]);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(GenerationConfig::from_dir(dir.path()).unwrap(), None);
    }
}
