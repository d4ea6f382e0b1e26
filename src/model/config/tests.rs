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
    assert!(matches!(classic.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
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
        v5.to_string().contains("rope_parameters.rope_type") && v5.to_string().contains("dynamic")
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
