//! Test support: trains a small BPE tokenizer with the `tokenizers` crate and writes it, with
//! tokenizer_config.json and generation_config.json, into a temporary model folder.

use std::collections::HashSet;

use serde_json::{json, Value};
use tokenizers::decoders::metaspace::{Metaspace, PrependScheme};
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

use crate::tokenizer::Tokenizer;

pub const BOS: &str = "<|bos|>";
pub const EOS: &str = "<|eos|>";
pub const EOT: &str = "<|eot|>";
pub const PAD: &str = "<|pad|>";

/// Training text: English prose plus accented Latin, CJK and emoji, so that some merges build whole
/// multi-byte characters and others stop inside them.
pub const CORPUS: &[&str] = &[
    "The quick brown fox jumps over the lazy dog while the scheduler batches requests.",
    "Continuous batching keeps the accelerator busy: decodes first, then prompt chunks.",
    "A paged key-value cache stores attention state in fixed-size blocks of sixteen tokens.",
    "Hello world! Hello again, world. Streaming tokens over a socket, one delta per step.",
    "Café au lait, crème brûlée, naïve résumé, déjà vu; the façade of the hôtel.",
    "中文分词测试。你好，世界！我们正在测试增量解码。",
    "Rockets 🚀 launch, parties 🎉 start, coders 👩‍💻 type, and the moon 🌕 rises.",
    "Numbers 0123456789 and symbols #$%&*()[]{} appear in logs and configs.",
    "Stop strings end generation; held text is released when it cannot match anymore.",
];

/// Knobs for one tokenizer folder; each test overrides only what it exercises.
#[derive(Debug, Clone)]
pub struct TokFixture {
    /// tokenizer.json's post-processor prepends the bos (Llama 3 style) instead of adding nothing.
    pub post_processor_bos: bool,
    pub add_bos_token: Option<bool>,
    /// Write bos/eos as `{"content": ...}` AddedToken objects instead of strings.
    pub token_objects: bool,
    /// generation_config.json's eos_token_id; `None` writes no generation_config.json.
    pub generation_eos: Option<Value>,
    pub chat_template: Option<Value>,
    /// SentencePiece-style Metaspace pre-tokenizer/decoder instead of byte-level.
    pub metaspace: bool,
    pub vocab_size: usize,
}

impl Default for TokFixture {
    fn default() -> Self {
        TokFixture {
            post_processor_bos: true,
            add_bos_token: None,
            token_objects: false,
            generation_eos: Some(json!([1, 2])),
            chat_template: None,
            metaspace: false,
            vocab_size: 600,
        }
    }
}

impl TokFixture {
    /// Writes the folder and returns it (keep it alive while the files are needed).
    pub fn write(&self) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let specials: Vec<AddedToken> = [BOS, EOS, EOT, PAD]
            .iter()
            .map(|t| AddedToken::from(*t, true))
            .collect();
        let mut tk = tokenizers::Tokenizer::new(BPE::default());
        let mut alphabet = HashSet::new();
        if self.metaspace {
            let ms = Metaspace::new('▁', PrependScheme::First, true);
            tk.with_pre_tokenizer(Some(ms.clone()));
            tk.with_decoder(Some(ms));
        } else {
            tk.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
            tk.with_decoder(Some(ByteLevel::default()));
            alphabet.extend(ByteLevel::alphabet());
        }
        let mut trainer: TrainerWrapper = BpeTrainer::builder()
            .show_progress(false)
            .vocab_size(self.vocab_size)
            .min_frequency(0)
            .special_tokens(specials)
            .initial_alphabet(alphabet)
            .build()
            .into();
        tk.train(&mut trainer, CORPUS.iter()).expect("train");
        assert_eq!(tk.token_to_id(BOS), Some(0), "special tokens come first");
        if self.post_processor_bos {
            let tp = TemplateProcessing::builder()
                .try_single(format!("{BOS} $A"))
                .expect("template")
                .special_tokens(vec![(BOS, 0)])
                .build()
                .expect("template processing");
            tk.with_post_processor(Some(tp));
        }
        tk.save(dir.path().join("tokenizer.json"), false)
            .expect("save tokenizer.json");

        let token = |t: &str| {
            if self.token_objects {
                json!({
                    "content": t, "lstrip": false, "rstrip": false,
                    "normalized": false, "single_word": false, "special": true,
                })
            } else {
                json!(t)
            }
        };
        let mut cfg = json!({"bos_token": token(BOS), "eos_token": token(EOS), "pad_token": PAD});
        if let Some(b) = self.add_bos_token {
            cfg["add_bos_token"] = json!(b);
        }
        if let Some(t) = &self.chat_template {
            cfg["chat_template"] = t.clone();
        }
        write_json(dir.path(), "tokenizer_config.json", &cfg);
        if let Some(eos) = &self.generation_eos {
            write_json(
                dir.path(),
                "generation_config.json",
                &json!({"bos_token_id": 0, "eos_token_id": eos}),
            );
        }
        dir
    }

    pub fn build(&self) -> Tokenizer {
        let dir = self.write();
        Tokenizer::from_dir(dir.path()).expect("load fixture tokenizer")
    }
}

pub fn write_json(dir: &std::path::Path, name: &str, value: &Value) {
    std::fs::write(dir.join(name), serde_json::to_string_pretty(value).unwrap()).unwrap();
}

/// Random text over ASCII, accented Latin, CJK, emoji (incl. a ZWJ sequence) and newlines.
pub fn random_text(rng: &mut impl rand::Rng, max_chars: usize) -> String {
    const PIECES: &[&str] = &[
        "a",
        "e",
        "o",
        "t",
        "s",
        "h",
        "r",
        "l",
        " ",
        " ",
        " ",
        "the",
        " world",
        "Hello",
        ",",
        ".",
        "!",
        "\n",
        "é",
        "è",
        "ü",
        "ç",
        "ñ",
        "中",
        "文",
        "你好",
        "世界",
        "🚀",
        "🎉",
        "👩‍💻",
        "🌕",
        "0",
        "7",
        "#",
        "→",
        "ß",
        "Ω",
        "日本",
        "한국어",
    ];
    let n = rng.random_range(1..=max_chars);
    (0..n)
        .map(|_| PIECES[rng.random_range(0..PIECES.len())])
        .collect()
}
