//! Model shapes for synthetic benchmarks (`brook bench --synthetic NAME`): the config.json of
//! well-known checkpoints, so random weights of their shapes can be generated without downloading
//! them (on the GPU by the CUDA executor), plus `tiny`, small enough to generate and run on the
//! CPU so the whole synthetic path is testable without a GPU.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::config::ModelConfig;
use crate::model::loader::{expected_tensors, ModelWeights};

/// Names `synthetic_config` knows, smallest first.
pub const SYNTHETIC_MODELS: &[&str] = &[
    "tiny",
    "tinyllama-1.1b",
    "phi-3-mini",
    "llama-2-7b",
    "llama-2-7b-16k",
    "qwen2.5-7b",
    "llama-3-8b",
    "qwen2.5-14b",
];

/// Shapes whose random weights are generated on the host and run on the CPU executor; the
/// others are billions of parameters, which only make sense on a GPU.
pub const CPU_SYNTHETIC_MODELS: &[&str] = &["tiny"];

pub fn synthetic_config(name: &str) -> anyhow::Result<ModelConfig> {
    synthetic_config_with_vocab(name, 0)
}

/// The shape `name` served with a tokenizer of `tokenizer_vocab` ids: its vocabulary grows to
/// the tokenizer's when that is larger, so every id a prompt can hold has an embedding (`tiny`'s
/// 2048 under the demo tokenizer's 4096). A larger shape vocabulary stays as it is (the LM head's
/// cost is part of the shape); the backend then samples only the tokenizer's ids.
pub fn synthetic_config_with_vocab(
    name: &str,
    tokenizer_vocab: usize,
) -> anyhow::Result<ModelConfig> {
    // (architecture, hidden, intermediate, layers, heads, kv heads, vocab, max positions, theta)
    const LLAMA: &str = "LlamaForCausalLM";
    const QWEN2: &str = "Qwen2ForCausalLM";
    const PHI3: &str = "Phi3ForCausalLM";
    let (arch, h, i, l, heads, kv, vocab, max_pos, theta) = match name {
        // GQA (2 query heads per kv head) at head_dim 64, small enough for the CPU.
        "tiny" => (LLAMA, 256, 688, 4, 4, 2, 2048, 2048, 10000.0),
        "tinyllama-1.1b" => (LLAMA, 2048, 5632, 22, 32, 4, 32000, 2048, 10000.0),
        // head_dim 96, MHA (Phi-3-mini-4k-instruct; its 2047-token window is kept).
        "phi-3-mini" => (PHI3, 3072, 8192, 32, 32, 32, 32064, 4096, 10000.0),
        "llama-2-7b" => (LLAMA, 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0),
        // Llama-2-7B's shapes with a 20k context, so documents of 8-16k tokens fit with their
        // chat template and output (the long-context serving benchmark, scripts/slo-gpu.sh).
        // Same parameters: the context length changes only the block tables and RoPE positions.
        "llama-2-7b-16k" => (LLAMA, 4096, 11008, 32, 32, 32, 32000, 20480, 10000.0),
        // 7 query heads per kv head, q/k/v biases.
        "qwen2.5-7b" => (QWEN2, 3584, 18944, 28, 28, 4, 152064, 32768, 1e6),
        "llama-3-8b" => (LLAMA, 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0),
        // 5 query heads per kv head.
        "qwen2.5-14b" => (QWEN2, 5120, 13824, 48, 40, 8, 152064, 32768, 1e6),
        other => anyhow::bail!(
            "unknown synthetic model {other:?}; known: {}",
            SYNTHETIC_MODELS.join(", ")
        ),
    };
    let mut json = serde_json::json!({
        "architectures": [arch],
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": l,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab.max(tokenizer_vocab),
        "max_position_embeddings": max_pos,
        "rope_theta": theta,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    });
    if arch == PHI3 {
        json["sliding_window"] = serde_json::json!(2047);
    }
    Ok(ModelConfig::from_json_str(&json.to_string())?)
}

/// Seeded random f32 weights of a CPU-sized synthetic shape, built on the host.
pub fn synthetic_host_weights(
    name: &str,
    cfg: &ModelConfig,
    seed: u64,
) -> anyhow::Result<ModelWeights> {
    anyhow::ensure!(
        CPU_SYNTHETIC_MODELS.contains(&name),
        "synthetic model {name} has {:.1}B parameters: it runs on a GPU only (--device cuda); \
         on the CPU use one of: {}",
        cfg.num_parameters() as f64 / 1e9,
        CPU_SYNTHETIC_MODELS.join(", ")
    );
    let tensors = random_weights(cfg, seed)?;
    Ok(ModelWeights::from_tensors(cfg, tensors)?)
}

/// Seeded f32 weights for `config`, keyed by Hugging Face tensor names. Linear weights have
/// standard deviation 1/√fan_in and norm weights are near 1, so activations and logits stay O(1).
pub fn random_weights(config: &ModelConfig, seed: u64) -> anyhow::Result<HashMap<String, Tensor>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = HashMap::new();
    for spec in expected_tensors(config) {
        let numel: usize = spec.shape.iter().product();
        let (center, std) = if spec.name.ends_with("norm.weight") {
            (1.0, 0.1)
        } else if spec.name.ends_with(".bias") {
            (0.0, 0.1)
        } else if spec.name == "model.embed_tokens.weight" {
            (0.0, 0.5)
        } else {
            (0.0, 1.0 / (spec.shape[1] as f32).sqrt())
        };
        // Uniform with the given standard deviation: half-width √3·std.
        let half_width = 3f32.sqrt() * std;
        let values: Vec<f32> = (0..numel)
            .map(|_| center + rng.random_range(-half_width..half_width))
            .collect();
        out.insert(
            spec.name,
            Tensor::from_vec(values, spec.shape, &Device::Cpu)?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_shapes_parse_with_their_parameter_counts() {
        let c = synthetic_config("llama-2-7b").unwrap();
        assert_eq!(c.head_dim, 128);
        assert!(
            (c.num_parameters() as f64 / 1e9 - 6.74).abs() < 0.01,
            "{}",
            c.num_parameters()
        );
        let t = synthetic_config("tinyllama-1.1b").unwrap();
        assert_eq!(
            (t.head_dim, t.num_attention_heads / t.num_key_value_heads),
            (64, 8)
        );
        assert!((t.num_parameters() as f64 / 1e9 - 1.10).abs() < 0.01);
        let l3 = synthetic_config("llama-3-8b").unwrap();
        assert!((l3.num_parameters() as f64 / 1e9 - 8.03).abs() < 0.01);
        let q = synthetic_config("qwen2.5-7b").unwrap();
        assert!(q.qkv_bias);
        assert_eq!(
            (q.head_dim, q.num_attention_heads / q.num_key_value_heads),
            (128, 7)
        );
        assert!(
            (q.num_parameters() as f64 / 1e9 - 7.62).abs() < 0.01,
            "{}",
            q.num_parameters()
        );
        let q14 = synthetic_config("qwen2.5-14b").unwrap();
        assert_eq!(q14.num_attention_heads / q14.num_key_value_heads, 5);
        assert!(
            (q14.num_parameters() as f64 / 1e9 - 14.77).abs() < 0.01,
            "{}",
            q14.num_parameters()
        );
        let phi = synthetic_config("phi-3-mini").unwrap();
        assert_eq!((phi.head_dim, phi.sliding_window), (96, Some(2047)));
        assert!(
            (phi.num_parameters() as f64 / 1e9 - 3.82).abs() < 0.01,
            "{}",
            phi.num_parameters()
        );
        let err = synthetic_config("gpt-2").unwrap_err().to_string();
        assert!(SYNTHETIC_MODELS.iter().all(|n| err.contains(n)), "{err}");
    }

    #[test]
    fn the_16k_preset_is_llama_2_7b_with_a_longer_context() {
        let base = synthetic_config("llama-2-7b").unwrap();
        let long = synthetic_config("llama-2-7b-16k").unwrap();
        assert!(long.max_position_embeddings >= 16384 + 2048);
        assert_eq!(long.num_parameters(), base.num_parameters());
        assert_eq!(
            (long.hidden_size, long.num_hidden_layers, long.vocab_size),
            (base.hidden_size, base.num_hidden_layers, base.vocab_size)
        );
    }

    #[test]
    fn a_larger_tokenizer_widens_the_vocabulary_a_smaller_one_does_not() {
        assert_eq!(
            synthetic_config_with_vocab("tiny", 4096)
                .unwrap()
                .vocab_size,
            4096
        );
        assert_eq!(
            synthetic_config_with_vocab("llama-2-7b", 4096)
                .unwrap()
                .vocab_size,
            32000
        );
    }

    #[test]
    fn tiny_is_gqa_and_every_name_parses() {
        for name in SYNTHETIC_MODELS {
            synthetic_config(name).unwrap();
        }
        let c = synthetic_config("tiny").unwrap();
        assert_eq!((c.head_dim, c.num_key_value_heads), (64, 2));
        assert!(c.num_attention_heads > c.num_key_value_heads);
        assert!(c.num_parameters() < 10_000_000, "{}", c.num_parameters());
    }

    #[test]
    fn host_weights_are_seeded_and_refused_for_big_shapes() {
        let cfg = synthetic_config("tiny").unwrap();
        let values = |seed| {
            let w = synthetic_host_weights("tiny", &cfg, seed).unwrap();
            w.layers[1]
                .k_proj
                .weight()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let a = values(5);
        assert_eq!(a, values(5));
        assert_ne!(a, values(6));
        assert!(a.iter().any(|&x| x != 0.0));
        let big = synthetic_config("llama-2-7b").unwrap();
        let err = synthetic_host_weights("llama-2-7b", &big, 0)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("GPU") && err.contains("tiny"), "{err}");
    }
}
