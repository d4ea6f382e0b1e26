//! Model shapes for synthetic benchmarks (`brook bench --synthetic NAME`): the config.json of
//! well-known checkpoints, so weights can be generated on the GPU without downloading them.

use crate::model::config::ModelConfig;

/// Names `synthetic_config` knows.
pub const SYNTHETIC_MODELS: &[&str] = &["llama-2-7b", "tinyllama-1.1b", "llama-3-8b"];

pub fn synthetic_config(name: &str) -> anyhow::Result<ModelConfig> {
    // (hidden, intermediate, layers, heads, kv heads, vocab, max positions, rope theta)
    let (h, i, l, heads, kv, vocab, max_pos, theta) = match name {
        "llama-2-7b" => (4096, 11008, 32, 32, 32, 32000, 4096, 10000.0),
        "tinyllama-1.1b" => (2048, 5632, 22, 32, 4, 32000, 2048, 10000.0),
        "llama-3-8b" => (4096, 14336, 32, 32, 8, 128256, 8192, 500000.0),
        other => anyhow::bail!(
            "unknown synthetic model {other:?}; known: {}",
            SYNTHETIC_MODELS.join(", ")
        ),
    };
    let json = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": l,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rope_theta": theta,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    });
    Ok(ModelConfig::from_json_str(&json.to_string())?)
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
        assert!(synthetic_config("gpt-2").is_err());
    }
}
