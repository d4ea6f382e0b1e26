//! `config.json` and `generation_config.json` of a Hugging Face checkpoint of the Llama family
//! (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, Phi-3; the differences are in `model::arch`).
//!
//! Fields are read as transformers writes them, including both RoPE spellings: the classic
//! top-level `rope_theta` + `rope_scaling`, and the transformers-5 `rope_parameters` block (which
//! carries `rope_theta` inside). Anything brook cannot run exactly (another architecture, another
//! activation, a RoPE variant it does not implement) is an error naming the field and value, never
//! a silent approximation.
//!
//! (Just over 600 lines: both RoPE spellings and every family's fields are parsed here; tests
//! and generation_config are in config/.)

use std::f64::consts::PI;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::model::ModelError;

pub use crate::model::arch::Architecture;
pub use generation::GenerationConfig;

mod generation;

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

pub(crate) fn read_file(path: &Path) -> Result<String, ModelError> {
    std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ModelError::MissingFile {
            path: path.to_path_buf(),
        },
        _ => ModelError::Io {
            path: path.to_path_buf(),
            reason: e,
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
mod tests;
