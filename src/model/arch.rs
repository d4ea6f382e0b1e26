//! The decoder families brook runs and how they differ. All are the Llama block (RMSNorm,
//! RoPE attention with GQA, SwiGLU MLP); the differences are small and read here from config.json
//! the way each family's transformers code reads them:
//!
//! | family | checkpoint names | biases | extras |
//! |---|---|---|---|
//! | Llama 2/3.x | q/k/v/o, gate/up/down | q,k,v,o under `attention_bias`; MLP under `mlp_bias` | llama3 RoPE scaling |
//! | Mistral | as Llama | none | `sliding_window` |
//! | Qwen2/2.5 | as Llama | q,k,v always | `sliding_window` only with `use_sliding_window` (refused) |
//! | Qwen3 | as Llama + `q_norm`/`k_norm` | q,k,v,o under `attention_bias` | RMSNorm per q/k head before RoPE |
//! | Phi-3 | fused `qkv_proj`, `gate_up_proj` | none | `sliding_window`, longrope |

use crate::model::ModelError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Phi3,
}

/// Which projections carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Biases {
    pub qkv: bool,
    pub o: bool,
    pub mlp: bool,
}

impl Architecture {
    pub const ALL: [Architecture; 5] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Phi3,
    ];

    pub fn hf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Phi3 => "Phi3ForCausalLM",
        }
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Phi3 => "phi3",
        }
    }

    pub fn from_hf_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.hf_name() == name)
    }

    pub fn from_model_type(model_type: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.model_type() == model_type)
    }

    /// The checkpoint stores q|k|v as one `qkv_proj` and gate|up as one `gate_up_proj` (Phi-3).
    pub fn fused_checkpoint(self) -> bool {
        self == Architecture::Phi3
    }

    /// RMSNorm on each query and key head before RoPE (Qwen3's `q_norm`/`k_norm`).
    pub fn qk_norm(self) -> bool {
        self == Architecture::Qwen3
    }

    /// The biases a checkpoint of this family has, from its `attention_bias` and `mlp_bias`.
    pub fn biases(self, attention_bias: bool, mlp_bias: bool) -> Biases {
        match self {
            Architecture::Llama => Biases {
                qkv: attention_bias,
                o: attention_bias,
                mlp: mlp_bias,
            },
            Architecture::Qwen3 => Biases {
                qkv: attention_bias,
                o: attention_bias,
                mlp: false,
            },
            // Qwen2Attention: bias=True on q/k/v, False on o, whatever the config says.
            Architecture::Qwen2 => Biases {
                qkv: true,
                o: false,
                mlp: false,
            },
            Architecture::Mistral | Architecture::Phi3 => Biases {
                qkv: false,
                o: false,
                mlp: false,
            },
        }
    }

    /// The attention window the family's transformers code applies, from config.json's
    /// `sliding_window` (outer None: the key is absent, inner None: `null`), `use_sliding_window`
    /// and `layer_types`. Windows on some layers only (Qwen's `max_window_layers`, mixed
    /// `layer_types`) are refused by name.
    pub fn sliding_window(
        self,
        sliding_window: Option<Option<usize>>,
        use_sliding_window: Option<bool>,
        layer_types: Option<&[String]>,
    ) -> Result<Option<usize>, ModelError> {
        let window = match self {
            Architecture::Llama => return Ok(None),
            // MistralConfig's default when the key is absent.
            Architecture::Mistral => sliding_window.unwrap_or(Some(4096)),
            Architecture::Phi3 => sliding_window.flatten(),
            Architecture::Qwen2 | Architecture::Qwen3 => {
                if use_sliding_window == Some(true) && sliding_window != Some(None) {
                    return Err(ModelError::unsupported(
                        "use_sliding_window (Qwen's sliding window on the layers from max_window_layers on)",
                        true,
                    ));
                }
                None
            }
        };
        if let Some(types) = layer_types {
            let sliding = types.iter().filter(|t| *t == "sliding_attention").count();
            if let Some(other) = types
                .iter()
                .find(|t| *t != "sliding_attention" && *t != "full_attention")
            {
                return Err(ModelError::unsupported("layer_types", other));
            }
            if sliding > 0 && sliding < types.len() {
                return Err(ModelError::unsupported(
                    "layer_types (sliding-window attention on some layers only)",
                    format!("{sliding} of {} layers", types.len()),
                ));
            }
            if sliding == 0 {
                return Ok(None);
            }
        }
        Ok(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Architecture::ALL {
            assert_eq!(Architecture::from_hf_name(a.hf_name()), Some(a));
            assert_eq!(Architecture::from_model_type(a.model_type()), Some(a));
        }
        assert_eq!(Architecture::from_hf_name("GPT2LMHeadModel"), None);
    }

    #[test]
    fn biases_follow_each_family() {
        let b = |a: Architecture, ab, mb| a.biases(ab, mb);
        assert_eq!(
            b(Architecture::Qwen2, false, false),
            Biases {
                qkv: true,
                o: false,
                mlp: false
            }
        );
        assert!(b(Architecture::Llama, true, true).o && b(Architecture::Llama, true, true).mlp);
        assert!(!b(Architecture::Qwen3, false, true).qkv);
        assert!(b(Architecture::Qwen3, true, true).o && !b(Architecture::Qwen3, true, true).mlp);
        assert!(!b(Architecture::Mistral, true, true).qkv);
    }

    #[test]
    fn sliding_window_per_family() {
        let sw = |a: Architecture, w, use_sw, types: Option<Vec<&str>>| {
            let types: Option<Vec<String>> =
                types.map(|t| t.into_iter().map(String::from).collect());
            a.sliding_window(w, use_sw, types.as_deref())
        };
        let w = |n| Some(Some(n));
        assert_eq!(
            sw(Architecture::Mistral, w(4096), None, None).unwrap(),
            Some(4096)
        );
        // MistralConfig's default for an absent key; null is no window.
        assert_eq!(
            sw(Architecture::Mistral, None, None, None).unwrap(),
            Some(4096)
        );
        assert_eq!(
            sw(Architecture::Mistral, Some(None), None, None).unwrap(),
            None
        );
        assert_eq!(
            sw(Architecture::Phi3, w(2047), None, None).unwrap(),
            Some(2047)
        );
        assert_eq!(sw(Architecture::Phi3, None, None, None).unwrap(), None);
        assert_eq!(sw(Architecture::Llama, w(4096), None, None).unwrap(), None);
        // Qwen writes a window it does not use unless use_sliding_window is set.
        assert_eq!(
            sw(Architecture::Qwen2, w(131072), Some(false), None).unwrap(),
            None
        );
        let err = sw(Architecture::Qwen3, w(4096), Some(true), None).unwrap_err();
        assert!(err.to_string().contains("use_sliding_window"), "{err}");
        let full = Some(vec!["full_attention"; 3]);
        assert_eq!(sw(Architecture::Mistral, w(64), None, full).unwrap(), None);
        let mixed = Some(vec!["sliding_attention", "full_attention"]);
        let err = sw(Architecture::Mistral, w(64), None, mixed).unwrap_err();
        assert!(err.to_string().contains("layer_types"), "{err}");
    }
}
