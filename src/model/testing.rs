//! Small random-weight Llama checkpoints for tests: a complete Hugging Face model folder
//! (config.json, safetensors, tokenizer.json, tokenizer_config.json, generation_config.json)
//! that every loader path reads exactly as it would a real one.
//!
//! Test-only, and kept out of the release binary: the library's unit tests compile it as
//! `model::testing` (`#[cfg(test)]`), the integration tests include this file with `#[path]`
//! (tests/common/mod.rs, tests/cuda_e2e.rs). Paths go through `brook::`, which names the
//! library in both (lib.rs declares `extern crate self as brook` for its tests).
//!
//! `TestModelSpec::default()` is a tiny GQA Llama in bf16; each test overrides one knob with the
//! builder methods. Weights are seeded, so a spec always writes the same model. Random weights make
//! random text: tests check mechanics and equalities, not language.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::Tensor;
use serde_json::json;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, TokenizerBuilder, TokenizerImpl};

use brook::model::config::{Architecture, ModelConfig, WeightDType};
use brook::model::synthetic::random_weights;

/// Special tokens of the test tokenizer, in id order (ids 0..6).
pub const SPECIAL_TOKENS: [&str; 6] = [
    "<s>",
    "</s>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
];
pub const BOS_TOKEN: &str = "<s>";
pub const EOS_TOKEN: &str = "</s>";
pub const END_OF_TURN_TOKEN: &str = "<|end|>";

/// A chat template in the style of the role-token models: `<|role|>\ncontent<|end|>\n` per
/// message, after the BOS token.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

/// Which spelling of the RoPE settings config.json uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Top-level `rope_theta` and `rope_scaling` (transformers 4).
    Classic,
    /// A `rope_parameters` block holding `rope_theta` (transformers 5).
    Parameters,
}

#[derive(Debug, Clone)]
pub struct TestModelSpec {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// Written explicitly as `head_dim`; may differ from hidden_size / num_heads.
    pub head_dim: usize,
    pub intermediate_size: usize,
    /// `None`: the tokenizer's size. Larger values pad the vocabulary as real checkpoints do.
    pub vocab_size: Option<usize>,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rope_style: RopeStyle,
    /// Llama 3.1 RoPE scaling with an original context of 64 positions (so it changes the
    /// frequencies that tiny head dims and short test sequences exercise).
    pub llama3_rope: bool,
    pub tie_word_embeddings: bool,
    /// `attention_bias` in config.json: q/k/v/o biases for Llama and Qwen3 (Qwen2 has q/k/v
    /// biases whatever it says; see `model::arch`).
    pub attention_bias: bool,
    /// `sliding_window` (Mistral and Phi-3 use it).
    pub sliding_window: Option<usize>,
    pub dtype: WeightDType,
    pub seed: u64,
    /// 1: `model.safetensors`; more: that many shards plus `model.safetensors.index.json`.
    pub shards: usize,
}

impl Default for TestModelSpec {
    fn default() -> Self {
        TestModelSpec {
            architecture: Architecture::Llama,
            hidden_size: 64,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            intermediate_size: 160,
            vocab_size: None,
            max_position_embeddings: 512,
            rope_theta: 10_000.0,
            rope_style: RopeStyle::Classic,
            llama3_rope: false,
            tie_word_embeddings: false,
            attention_bias: false,
            sliding_window: None,
            dtype: WeightDType::BF16,
            seed: 0,
            shards: 1,
        }
    }
}

impl TestModelSpec {
    /// The KV tier tests' model (CPU and CUDA alike): 3 layers, GQA 8/2, head_dim 64, so a
    /// block is many planes and a swap moves real bytes.
    pub fn kv_tier() -> Self {
        TestModelSpec::default()
            .hidden_size(256)
            .heads(8, 2)
            .head_dim(64)
            .intermediate_size(512)
            .layers(3)
    }
    pub fn architecture(mut self, a: Architecture) -> Self {
        self.architecture = a;
        self
    }
    pub fn hidden_size(mut self, n: usize) -> Self {
        self.hidden_size = n;
        self
    }
    pub fn layers(mut self, n: usize) -> Self {
        self.num_layers = n;
        self
    }
    /// Query and key/value head counts (equal: MHA; kv 1: MQA).
    pub fn heads(mut self, heads: usize, kv_heads: usize) -> Self {
        self.num_heads = heads;
        self.num_kv_heads = kv_heads;
        self
    }
    pub fn head_dim(mut self, n: usize) -> Self {
        self.head_dim = n;
        self
    }
    pub fn intermediate_size(mut self, n: usize) -> Self {
        self.intermediate_size = n;
        self
    }
    pub fn vocab_size(mut self, n: usize) -> Self {
        self.vocab_size = Some(n);
        self
    }
    pub fn max_position_embeddings(mut self, n: usize) -> Self {
        self.max_position_embeddings = n;
        self
    }
    pub fn rope_theta(mut self, theta: f64) -> Self {
        self.rope_theta = theta;
        self
    }
    pub fn rope_style(mut self, style: RopeStyle) -> Self {
        self.rope_style = style;
        self
    }
    pub fn llama3_rope(mut self, on: bool) -> Self {
        self.llama3_rope = on;
        self
    }
    pub fn tied(mut self, tied: bool) -> Self {
        self.tie_word_embeddings = tied;
        self
    }
    pub fn attention_bias(mut self, on: bool) -> Self {
        self.attention_bias = on;
        self
    }
    pub fn sliding_window(mut self, window: Option<usize>) -> Self {
        self.sliding_window = window;
        self
    }
    pub fn dtype(mut self, dtype: WeightDType) -> Self {
        self.dtype = dtype;
        self
    }
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }

    /// config.json for this spec, given the tokenizer's special token ids.
    pub fn config_json(&self, vocab_size: usize, bos: u32, eos: u32) -> serde_json::Value {
        let arch = self.architecture.hf_name();
        let model_type = self.architecture.model_type();
        let scaling = if self.llama3_rope {
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64})
        } else {
            json!({"rope_type": "default"})
        };
        let mut c = json!({
            "architectures": [arch],
            "model_type": model_type,
            "vocab_size": vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": false,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "torch_dtype": self.dtype.hf_name(),
        });
        let m = c.as_object_mut().expect("config is an object");
        m.insert("sliding_window".into(), json!(self.sliding_window));
        match self.rope_style {
            RopeStyle::Classic => {
                m.insert("rope_theta".into(), json!(self.rope_theta));
                if self.llama3_rope {
                    m.insert("rope_scaling".into(), scaling);
                }
            }
            RopeStyle::Parameters => {
                let mut block = scaling;
                block["rope_theta"] = json!(self.rope_theta);
                m.insert("rope_parameters".into(), block);
            }
        }
        c
    }
}

/// `spec`'s model written to a temporary folder (kept alive by the returned guard) and loaded:
/// its config and f32 weights.
pub fn load_test_model(
    spec: &TestModelSpec,
) -> (
    tempfile::TempDir,
    ModelConfig,
    brook::model::loader::ModelWeights,
) {
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), spec).unwrap();
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let weights = brook::model::loader::load_weights(dir.path(), &config, false).unwrap();
    (dir, config, weights)
}

/// Writes a complete model folder for `spec` into `dir` (which must exist).
pub fn write_test_model(dir: &Path, spec: &TestModelSpec) -> anyhow::Result<()> {
    let tokenizer = build_tokenizer()?;
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(|e| anyhow::anyhow!("writing tokenizer.json: {e}"))?;
    let id = |t: &str| {
        tokenizer
            .token_to_id(t)
            .with_context(|| format!("test tokenizer lacks {t}"))
    };
    let (bos, eos, end) = (id(BOS_TOKEN)?, id(EOS_TOKEN)?, id(END_OF_TURN_TOKEN)?);
    let tokenizer_size = tokenizer.get_vocab_size(true);
    let vocab_size = spec.vocab_size.unwrap_or(tokenizer_size);
    anyhow::ensure!(
        vocab_size >= tokenizer_size,
        "vocab_size {vocab_size} < tokenizer size {tokenizer_size}"
    );

    let config_json = spec.config_json(vocab_size, bos, eos);
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config_json)?,
    )?;
    let config = ModelConfig::from_json_str(&config_json.to_string())?;
    write_weights(dir, &random_weights(&config, spec.seed)?, spec)?;

    let tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": true,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&tokenizer_config)?,
    )?;
    let generation_config = json!({"bos_token_id": bos, "eos_token_id": [eos, end]});
    std::fs::write(
        dir.join("generation_config.json"),
        serde_json::to_string_pretty(&generation_config)?,
    )?;
    Ok(())
}

fn write_weights(
    dir: &Path,
    weights: &HashMap<String, Tensor>,
    spec: &TestModelSpec,
) -> anyhow::Result<()> {
    let stored: HashMap<&String, Tensor> = weights
        .iter()
        .map(|(k, t)| Ok((k, t.to_dtype(spec.dtype.to_candle())?)))
        .collect::<candle_core::Result<_>>()?;
    if spec.shards <= 1 {
        candle_core::safetensors::save(&stored, dir.join("model.safetensors"))?;
        return Ok(());
    }
    let mut names: Vec<&String> = stored.keys().copied().collect();
    names.sort();
    let per_shard = names.len().div_ceil(spec.shards);
    let mut weight_map = serde_json::Map::new();
    let mut total_size = 0;
    for (i, chunk) in names.chunks(per_shard).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, spec.shards);
        let shard: HashMap<&String, Tensor> =
            chunk.iter().map(|&n| (n, stored[n].clone())).collect();
        candle_core::safetensors::save(&shard, dir.join(&file))?;
        for (name, t) in &shard {
            weight_map.insert((*name).clone(), json!(file));
            total_size += t.elem_count() * spec.dtype.size_in_bytes();
        }
    }
    let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index)?,
    )?;
    Ok(())
}

type TestTokenizer =
    TokenizerImpl<BPE, NormalizerWrapper, ByteLevel, TemplateProcessing, ByteLevelDecoder>;

/// A byte-level BPE tokenizer: the 256 byte symbols, merges learned from `TRAINING_TEXT`, and the
/// special tokens. Its post-processor prepends `<s>` (as Llama tokenizers do), so encoding with
/// special tokens adds BOS; text rendered by the chat template already starts with it.
fn build_tokenizer() -> anyhow::Result<TestTokenizer> {
    let byte_level = ByteLevel::new(false, true, true);
    let mut tokenizer: TestTokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(byte_level))
        .with_decoder(Some(ByteLevelDecoder::default()))
        .build()
        .map_err(|e| anyhow::anyhow!("building the test tokenizer: {e}"))?;
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(SPECIAL_TOKENS.len() + 256 + 250)
        .min_frequency(2)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(
            SPECIAL_TOKENS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .build();
    tokenizer
        .train(&mut trainer, TRAINING_TEXT.lines())
        .map_err(|e| anyhow::anyhow!("training the test tokenizer: {e}"))?;
    let bos = tokenizer
        .token_to_id(BOS_TOKEN)
        .context("trained tokenizer lacks <s>")?;
    let template = TemplateProcessing::builder()
        .try_single(format!("{BOS_TOKEN} $A"))
        .map_err(anyhow::Error::msg)?
        .try_pair(format!("{BOS_TOKEN} $A {BOS_TOKEN} $B"))
        .map_err(anyhow::Error::msg)?
        .special_tokens(vec![(BOS_TOKEN, bos)])
        .build()?;
    tokenizer.with_post_processor(Some(template));
    Ok(tokenizer)
}

/// Training text for the merges: plain English, so common words become single tokens.
const TRAINING_TEXT: &str = "\
A brook is a small stream of fresh water that runs over stones and under old trees.
The water in the brook is cold and clear, and you can see the fish that swim in it.
In the morning the light comes through the leaves and the brook shines like glass.
Children like to play by the water, to throw small stones and to watch them sink.
When the rain comes, the brook grows and runs faster, and its sound is louder.
In the summer it is slow and quiet, and the birds come down to drink from it.
The brook joins a river, and the river runs to the sea, where the water is salt.
People have lived by rivers for a long time, because water is what every life needs.
They built mills on the banks, and the mills turned with the force of the stream.
Today we still walk by the water to think, to rest, and to listen to the sound it makes.
What is the name of the brook? It has no name on the map, but the people here know it.
Can you tell me the way to the river? Follow the brook down the hill and you will find it.
The quick brown fox jumps over the lazy dog, and the dog does not move at all.
Hello, how are you today? I am well, thank you. The weather is good for a walk.
Please write a short story about a stream, a stone, and a small green frog.
Once upon a time there was a frog who lived under a stone in a quiet stream.
Every day the frog would sit on the stone and watch the water run past.
One day a storm came, the stream grew strong, and the stone began to roll.
The frog held on and rode the stone all the way down to the wide river.
There it found new friends, and it never wanted to go back to the small stream.
Numbers: 1, 2, 3, 10, 42, 100, 2024. Symbols: (a + b) * c = d; x < y > z.
";
