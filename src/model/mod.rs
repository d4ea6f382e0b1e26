//! Model loading and the CPU forward: Hugging Face config and safetensors checkpoints of the
//! Llama family (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, Phi-3: `arch`), the paged batched forward the CPU executor runs, the plain
//! forward the tests compare it with, the checkpoint streamed as bf16 into the CUDA executor's
//! fused layout, tensor-parallel shards of a model's weights (`shard`), a writer of small
//! random-weight test checkpoints, and the shapes of synthetic (random-weight) benchmark models.

pub mod arch;
pub mod config;
pub mod cpu_attention;
pub mod cpu_ops;
pub mod fused;
pub mod llama;
pub mod loader;
pub mod reference;
pub mod shard;
pub mod synthetic;
/// Test-only (see its header): never in the release binary.
#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod testing_tests;

use std::path::PathBuf;

use thiserror::Error;

/// What can go wrong reading a model folder. Each variant names the file, field or tensor at fault
/// so a start-up failure says exactly what to fix.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("missing file {}", path.display())]
    MissingFile { path: PathBuf },
    // The causes are part of the message and not `source`s: printed with its chain (`{:#}`),
    // a source would repeat itself.
    #[error("cannot read {}: {reason}", path.display())]
    Io {
        path: PathBuf,
        reason: std::io::Error,
    },
    #[error("cannot parse {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("unsupported architecture {0:?} (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM)")]
    UnknownArchitecture(String),
    #[error("unsupported value for {field}: {value}")]
    Unsupported { field: String, value: String },
    #[error("invalid config: {0}")]
    Invalid(String),
    #[error("tensor {name} not found in {}", path.display())]
    MissingTensor { name: String, path: PathBuf },
    #[error("tensor {name} has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("tensor {name}: {reason}")]
    Tensor {
        name: String,
        reason: candle_core::Error,
    },
}

impl ModelError {
    pub(crate) fn unsupported(field: impl Into<String>, value: impl std::fmt::Display) -> Self {
        ModelError::Unsupported {
            field: field.into(),
            value: value.to_string(),
        }
    }
}
