//! The model's tokenizer: a thin wrapper around the `tokenizers` crate plus the parts of a Hugging
//! Face model folder that give tokens their meaning (bos/eos, add_bos_token, chat_template).
//!
//! BOS policy of [`Tokenizer::encode`] with `add_special_tokens = true`:
//! 1. the tokenizer.json post-processor runs (e.g. Llama 3's `TemplateProcessing` prepends
//!    `<|begin_of_text|>`);
//! 2. if tokenizer_config.json says `add_bos_token: true` and the post-processor did not put a bos
//!    first, one is prepended (old Llama/Mistral exports whose post-processor adds nothing);
//! 3. if the text itself starts with the bos text (a rendered chat template does), the resulting
//!    duplicate leading bos is dropped, so a chat render never gets two.
//!
//! `add_bos_token: false` does not strip a bos that the post-processor adds: transformers' generic
//! fast tokenizer ignores that key too, and tokenizer.json is the more specific description.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::model::config::GenerationConfig;

/// A missing or malformed file in the model folder, or a failure inside `tokenizers`.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: file not found")]
    Missing { path: PathBuf },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("tokenizer failed to encode the text: {0}")]
    Encode(String),
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// Immutable after loading; share it as `Arc<Tokenizer>` between the session actors (encode) and
/// the scheduler (detokenize).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    bos_id: Option<u32>,
    eos_token: Option<String>,
    /// The tokenizer's eos first, then generation_config.json's extra ids, without duplicates.
    eos_ids: Vec<u32>,
    add_bos_token: bool,
    chat_template: Option<String>,
    vocab_size: usize,
    /// Sorted; what `decode(.., skip_special_tokens = true)` drops.
    special_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("eos_ids", &self.eos_ids)
            .field("add_bos_token", &self.add_bos_token)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => TokenizerError::Missing {
            path: path.to_owned(),
        },
        _ => TokenizerError::Invalid {
            path: path.to_owned(),
            reason: e.to_string(),
        },
    })?;
    serde_json::from_str(&text).map_err(|e| TokenizerError::Invalid {
        path: path.to_owned(),
        reason: format!("invalid JSON: {e}"),
    })
}

fn invalid(path: &Path, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::Invalid {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// `bos_token` / `eos_token` come either as a plain string or as a serialized AddedToken
/// (`{"content": "<s>", "lstrip": false, ...}`); `null` means the model has none.
fn special_token_text(cfg: &Value, key: &str, path: &Path) -> Result<Option<String>> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(invalid(path, format!("{key}.content must be a string"))),
        },
        Some(_) => Err(invalid(
            path,
            format!("{key} must be a string or an object with a \"content\" string"),
        )),
    }
}

/// `chat_template` is a string, or a list of named templates of which "default" is the one used
/// for plain chat (the others are e.g. "tool_use" or "rag").
fn chat_template_from_config(cfg: &Value, path: &Path) -> Result<Option<String>> {
    match cfg.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            for (i, entry) in list.iter().enumerate() {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_owned())),
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err(invalid(
                            path,
                            format!(
                            "chat_template[{i}] must be {{\"name\": string, \"template\": string}}"
                        ),
                        ))
                    }
                }
            }
            tracing::warn!(
                "{}: chat_template list has no entry named \"default\"; chat messages are disabled",
                path.display()
            );
            Ok(None)
        }
        Some(_) => Err(invalid(
            path,
            "chat_template must be a string or a list of {name, template}",
        )),
    }
}

impl Tokenizer {
    /// Loads tokenizer.json and tokenizer_config.json (both required) and generation_config.json
    /// (optional) from a Hugging Face model folder. A chat_template.jinja file, when present, takes
    /// precedence over tokenizer_config.json's `chat_template`, as in transformers.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let gen = GenerationConfig::from_dir(dir)
            .map_err(|e| invalid(&dir.join("generation_config.json"), e.to_string()))?;
        Self::from_dir_with(dir, gen.as_ref())
    }

    /// As [`Tokenizer::from_dir`], with generation_config.json already parsed (the engine parses
    /// it once, for this and for the model's sampling defaults): its eos ids join the
    /// tokenizer's, and its bos id names the bos when tokenizer_config.json has none.
    pub fn from_dir_with(dir: &Path, gen: Option<&GenerationConfig>) -> Result<Tokenizer> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(TokenizerError::Missing { path: tok_path });
        }
        let inner = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| invalid(&tok_path, e.to_string()))?;

        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = read_json(&cfg_path)?;
        let bos_token = special_token_text(&cfg, "bos_token", &cfg_path)?;
        let eos_token = special_token_text(&cfg, "eos_token", &cfg_path)?;
        let add_bos_token = match cfg.get("add_bos_token") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid(&cfg_path, "add_bos_token must be true or false")),
        };
        let jinja_path = dir.join("chat_template.jinja");
        let chat_template = if jinja_path.is_file() {
            Some(
                std::fs::read_to_string(&jinja_path)
                    .map_err(|e| invalid(&jinja_path, e.to_string()))?,
            )
        } else {
            chat_template_from_config(&cfg, &cfg_path)?
        };

        let gen_path = dir.join("generation_config.json");
        let (gen_eos, gen_bos) = match gen {
            Some(g) => (g.eos_token_ids.clone(), g.bos_token_id),
            None => (Vec::new(), None),
        };

        let lookup = |token: &Option<String>, key: &str| -> Result<Option<u32>> {
            match token {
                None => Ok(None),
                Some(t) => inner.token_to_id(t).map(Some).ok_or_else(|| {
                    invalid(
                        &cfg_path,
                        format!("{key} {t:?} is not in tokenizer.json's vocabulary"),
                    )
                }),
            }
        };
        let mut bos_id = lookup(&bos_token, "bos_token")?;
        let mut bos_token = bos_token;
        // Some exports name the bos only in generation_config.json.
        if bos_token.is_none() {
            if let Some(id) = gen_bos {
                bos_token = inner.id_to_token(id);
                bos_id = bos_token.as_ref().map(|_| id);
            }
        }
        let eos_id = lookup(&eos_token, "eos_token")?;

        // Ids past the end can exist when added tokens sit above the model vocab; count them all so
        // that every id the tokenizer can produce is below vocab_size.
        let added = inner.get_added_vocabulary().get_added_tokens_decoder();
        let max_added = added.keys().map(|&id| id as usize + 1).max();
        let mut special_ids: Vec<u32> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        special_ids.sort_unstable();
        let vocab_size = inner.get_vocab_size(false).max(max_added.unwrap_or(0));
        if let Some(&bad) = gen_eos.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(invalid(
                &gen_path,
                format!("eos_token_id {bad} is outside the tokenizer's vocabulary of {vocab_size}"),
            ));
        }
        let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
        for id in gen_eos {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }

        Ok(Tokenizer {
            inner,
            bos_token,
            bos_id,
            eos_token,
            eos_ids,
            add_bos_token,
            chat_template,
            vocab_size,
            special_ids,
        })
    }

    /// Encodes `text`; see the module docs for how `add_special_tokens` places the bos.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut ids = enc.get_ids().to_vec();
        if let (true, Some(bos)) = (add_special_tokens, self.bos_id) {
            if self.add_bos_token && ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
            let text_has_bos = self
                .bos_token
                .as_deref()
                .is_some_and(|b| text.starts_with(b));
            if text_has_bos && ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                ids.remove(0);
            }
        }
        Ok(ids)
    }

    /// Decodes `ids`; ids outside the vocabulary are dropped (a model's embedding may be padded
    /// past the tokenizer's vocabulary).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        // The stock decoders only fail on malformed decoder configs, which loading already
        // exercised; an empty string is the least harmful answer to a client mid-stream.
        self.inner
            .decode(ids, skip_special_tokens)
            .unwrap_or_else(|e| {
                tracing::warn!("tokenizer failed to decode {} ids: {e}", ids.len());
                String::new()
            })
    }

    /// Token ids that end generation (unless `ignore_eos`).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// One past the largest id the tokenizer can produce (model vocab plus added tokens).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of `id` (added tokens included); None past the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special (control) token, which decoding with skip_special_tokens drops.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.binary_search(&id).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tokenizer_fixture::{write_json, TokFixture, BOS, EOS, EOT};

    #[test]
    fn tokenizer_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<std::sync::Arc<Tokenizer>>();
    }

    #[test]
    fn loads_special_tokens_and_merges_eos_list() {
        let tok = TokFixture::default().build();
        assert_eq!(tok.bos_token(), Some(BOS));
        assert_eq!(tok.eos_token(), Some(EOS));
        assert_eq!(tok.bos_token_id(), Some(0));
        // tokenizer_config's eos (id 1) first, then generation_config's [1, 2] without the dup.
        assert_eq!(tok.eos_token_ids(), &[1, 2]);
        assert_eq!(tok.token_to_id(EOT), Some(2));
        assert_eq!(tok.vocab_size(), 600);
        assert!(tok.is_special(0) && tok.is_special(3) && !tok.is_special(4));
        assert_eq!(tok.chat_template(), None);
    }

    #[test]
    fn accepts_added_token_objects_for_bos_and_eos() {
        let tok = TokFixture {
            token_objects: true,
            ..Default::default()
        }
        .build();
        assert_eq!(tok.bos_token(), Some(BOS));
        assert_eq!(tok.eos_token(), Some(EOS));
        assert_eq!(tok.eos_token_ids(), &[1, 2]);
    }

    #[test]
    fn eos_from_generation_config_as_number_or_absent() {
        let single = TokFixture {
            generation_eos: Some(json!(2)),
            ..Default::default()
        }
        .build();
        assert_eq!(single.eos_token_ids(), &[1, 2]);
        let absent = TokFixture {
            generation_eos: None,
            ..Default::default()
        }
        .build();
        assert_eq!(absent.eos_token_ids(), &[1]);
    }

    #[test]
    fn chat_template_string_list_and_jinja_file() {
        let plain = TokFixture {
            chat_template: Some(json!("{{ messages }}")),
            ..Default::default()
        }
        .build();
        assert_eq!(plain.chat_template(), Some("{{ messages }}"));

        let named = TokFixture {
            chat_template: Some(json!([
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "chat"},
            ])),
            ..Default::default()
        }
        .build();
        assert_eq!(named.chat_template(), Some("chat"));

        let dir = TokFixture {
            chat_template: Some(json!("from config")),
            ..Default::default()
        }
        .write();
        std::fs::write(dir.path().join("chat_template.jinja"), "from file").unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.chat_template(), Some("from file"));
    }

    #[test]
    fn errors_name_the_missing_or_invalid_file() {
        // Each case breaks one file of a good fixture: the error names the file and the fault.
        type Edit<'a> = &'a dyn Fn(&Path);
        let err_after = |edit: Edit| {
            let dir = TokFixture::default().write();
            edit(dir.path());
            Tokenizer::from_dir(dir.path()).unwrap_err().to_string()
        };
        let cases: [(Edit, &[&str]); 5] = [
            (
                &|d| std::fs::remove_file(d.join("tokenizer_config.json")).unwrap(),
                &["tokenizer_config.json", "not found"],
            ),
            (
                &|d| std::fs::remove_file(d.join("tokenizer.json")).unwrap(),
                &["tokenizer.json", "not found"],
            ),
            (
                &|d| std::fs::write(d.join("generation_config.json"), "{ not json").unwrap(),
                &["generation_config.json", "cannot parse"],
            ),
            (
                &|d| write_json(d, "tokenizer_config.json", &json!({"bos_token": 7})),
                &["tokenizer_config.json", "bos_token"],
            ),
            (
                &|d| write_json(d, "tokenizer_config.json", &json!({"eos_token": "<nope>"})),
                &["\"<nope>\" is not in"],
            ),
        ];
        for (edit, needles) in cases {
            let err = err_after(edit);
            assert!(needles.iter().all(|n| err.contains(n)), "{err}");
        }

        let dir = TokFixture {
            generation_eos: Some(json!([1, 99999])),
            ..Default::default()
        }
        .write();
        let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("generation_config.json") && err.contains("99999"),
            "{err}"
        );
    }

    fn count(ids: &[u32], id: u32) -> usize {
        ids.iter().filter(|&&i| i == id).count()
    }

    #[test]
    fn bos_from_post_processor_once() {
        let tok = TokFixture::default().build();
        let with = tok.encode("Hello world", true).unwrap();
        let without = tok.encode("Hello world", false).unwrap();
        assert_eq!(with[0], 0);
        assert_eq!(&with[1..], &without[..]);
        assert_eq!(count(&without, 0), 0);
        // A chat render that starts with the bos text gets exactly one bos.
        let rendered = format!("{BOS}Hello world");
        let ids = tok.encode(&rendered, true).unwrap();
        assert_eq!((ids[0], count(&ids, 0)), (0, 1), "{ids:?}");
        assert_eq!(&ids[1..], &without[..]);
    }

    #[test]
    fn bos_from_add_bos_token_when_post_processor_adds_none() {
        let tok = TokFixture {
            post_processor_bos: false,
            add_bos_token: Some(true),
            ..Default::default()
        }
        .build();
        let with = tok.encode("Hello world", true).unwrap();
        let without = tok.encode("Hello world", false).unwrap();
        assert_eq!(with[0], 0);
        assert_eq!(&with[1..], &without[..]);
        let ids = tok.encode(&format!("{BOS}Hello world"), true).unwrap();
        assert_eq!(count(&ids, 0), 1, "{ids:?}");
    }

    #[test]
    fn no_bos_without_post_processor_or_add_bos_token() {
        let tok = TokFixture {
            post_processor_bos: false,
            ..Default::default()
        }
        .build();
        let ids = tok.encode("Hello world", true).unwrap();
        assert_eq!(ids, tok.encode("Hello world", false).unwrap());
        assert_eq!(count(&ids, 0), 0);
    }

    #[test]
    fn decode_round_trips_and_skips_special_tokens() {
        let tok = TokFixture::default().build();
        let text = "Café 中文 🚀 hello";
        let mut ids = tok.encode(text, true).unwrap();
        ids.push(1);
        assert_eq!(tok.decode(&ids, true), text);
        assert_eq!(tok.decode(&ids, false), format!("{BOS}{text}{EOS}"));
        // Ids past the vocabulary (padded embeddings) are dropped, not a panic.
        assert_eq!(tok.decode(&[u32::MAX], true), "");
    }
}
