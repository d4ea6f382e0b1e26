//! Whether a draft model can draft for a target, checked at start-up so that a mismatched pair
//! is refused with a message naming the difference rather than served with drafts that are
//! never accepted (or, with a different vocabulary, ids the target reads as other tokens).

use std::path::Path;

use crate::model::config::ModelConfig;
use crate::tokenizer::Tokenizer;

/// The pair's configs and tokenizers, as loaded from their folders.
pub struct Pair<'a> {
    pub target_dir: &'a Path,
    pub target: &'a ModelConfig,
    pub target_tokenizer: Option<&'a Tokenizer>,
    pub draft_dir: &'a Path,
    pub draft: &'a ModelConfig,
    pub draft_tokenizer: Option<&'a Tokenizer>,
    /// Longest sequence the engine serves: the draft computes positions up to it.
    pub max_model_len: usize,
}

/// Ok when the draft reads and writes the target's token ids, covers its context and shares
/// its KV block tables; else the reason.
pub fn check(p: &Pair) -> anyhow::Result<()> {
    let (t, d) = (p.target_dir.display(), p.draft_dir.display());
    let refuse = |why: String| {
        Err(anyhow::anyhow!(
            "draft model {d} cannot draft for {t}: {why}"
        ))
    };
    if p.draft.vocab_size != p.target.vocab_size {
        return refuse(format!(
            "its vocabulary has {} ids, the target's {}",
            p.draft.vocab_size, p.target.vocab_size
        ));
    }
    if p.draft.max_position_embeddings < p.max_model_len {
        return refuse(format!(
            "it reads {} positions, the engine serves {} (lower --max-model-len)",
            p.draft.max_position_embeddings, p.max_model_len
        ));
    }
    // Draft K/V lives in the target's blocks: a block freed behind a sliding window would be
    // missing for the draft too.
    if p.target.sliding_window.is_some() || p.draft.sliding_window.is_some() {
        return refuse(
            "sliding-window attention is not supported with a draft model (use --speculative ngram)"
                .into(),
        );
    }
    match (p.target_tokenizer, p.draft_tokenizer) {
        (Some(a), Some(b)) => same_tokenizer(a, b).or_else(&refuse),
        (None, None) => Ok(()),
        (Some(_), None) => refuse("it has no tokenizer.json, the target does".into()),
        (None, Some(_)) => refuse("it has a tokenizer.json, the target does not".into()),
    }
}

/// Equal vocabularies (every id maps to the same token string) and special tokens.
fn same_tokenizer(a: &Tokenizer, b: &Tokenizer) -> Result<(), String> {
    if a.vocab_size() != b.vocab_size() {
        return Err(format!(
            "its tokenizer has {} tokens, the target's {}",
            b.vocab_size(),
            a.vocab_size()
        ));
    }
    for id in 0..a.vocab_size() as u32 {
        let (x, y) = (a.id_to_token(id), b.id_to_token(id));
        if x != y {
            let show = |t: Option<String>| t.map_or("no token".into(), |t| format!("{t:?}"));
            return Err(format!(
                "token id {id} is {} in its tokenizer, {} in the target's",
                show(y),
                show(x)
            ));
        }
    }
    if a.bos_token_id() != b.bos_token_id() || a.eos_token_ids() != b.eos_token_ids() {
        return Err(format!(
            "its bos/eos ids are {:?}/{:?}, the target's {:?}/{:?}",
            b.bos_token_id(),
            b.eos_token_ids(),
            a.bos_token_id(),
            a.eos_token_ids()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn demo(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("models")
            .join(name)
    }

    fn load(dir: &Path) -> (ModelConfig, Tokenizer) {
        (
            ModelConfig::from_dir(dir).unwrap(),
            Tokenizer::from_dir(dir).unwrap(),
        )
    }

    fn check_dirs(target: &Path, draft: &Path, max_model_len: usize) -> anyhow::Result<()> {
        let (tc, tt) = load(target);
        let (dc, dt) = load(draft);
        check(&Pair {
            target_dir: target,
            target: &tc,
            target_tokenizer: Some(&tt),
            draft_dir: draft,
            draft: &dc,
            draft_tokenizer: Some(&dt),
            max_model_len,
        })
    }

    #[test]
    fn the_demo_pair_is_compatible() {
        check_dirs(&demo("demo-chat"), &demo("demo-chat-draft"), 1024).unwrap();
    }

    /// A copy of the draft whose tokenizer swaps two tokens' ids.
    fn swapped_draft() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let src = demo("demo-chat-draft");
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap().path();
            if f.file_name().unwrap() != "model.safetensors" {
                std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
            }
        }
        let path = dir.path().join("tokenizer.json");
        let mut tok: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
        let (a, b) = ("Ġorder".to_string(), "Ġreturn".to_string());
        let (ia, ib) = (vocab[&a].clone(), vocab[&b].clone());
        vocab.insert(a, ib);
        vocab.insert(b, ia);
        std::fs::write(&path, tok.to_string()).unwrap();
        dir
    }

    #[test]
    fn a_pair_with_different_tokenizers_is_refused_naming_a_token() {
        let draft = swapped_draft();
        let err = check_dirs(&demo("demo-chat"), draft.path(), 1024)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot draft for") && err.contains("token id"),
            "{err}"
        );
    }

    #[test]
    fn a_draft_shorter_than_the_context_is_refused() {
        let err = check_dirs(&demo("demo-chat"), &demo("demo-chat-draft"), 2048)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--max-model-len"), "{err}");
    }
}
