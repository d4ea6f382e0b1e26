//! Response bodies as OpenAI returns them: `chat.completion` and its `chat.completion.chunk`s,
//! `text_completion` (whole and streamed), `usage`, `finish_reason`, and the two logprobs
//! layouts (chat: `content` entries with `top_logprobs`; completions: parallel lists).

use serde_json::{json, Map, Value};

use super::request::Endpoint;
use crate::protocol::token_text;
use crate::request::{FinishReason, TokenLogprobs};
use crate::tokenizer::Tokenizer;

/// What every body of one response repeats.
#[derive(Debug, Clone)]
pub struct Meta {
    pub endpoint: Endpoint,
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    /// Some: the request asked for log-probabilities.
    pub logprobs: Option<usize>,
    /// Streams carry `"usage": null` in every chunk and a last chunk with the usage.
    pub include_usage: bool,
}

/// One choice, whole (non-streaming responses).
#[derive(Debug, Clone, Default)]
pub struct ChoiceOut {
    pub text: String,
    pub finish_reason: Option<FinishReason>,
    pub completion_tokens: usize,
    pub logprobs: Vec<TokenLogprobs>,
}

/// OpenAI's `finish_reason`: `stop` (eos, a stop token or string) or `length`. A cancelled
/// request has no OpenAI counterpart (the HTTP client cannot cancel; it can only go away, and
/// then nothing is sent), so it reads as `stop`.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

fn token_entry(tok: &Tokenizer, id: u32, logprob: f32) -> Value {
    let text = token_text(Some(tok), id);
    json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
}

/// Chat: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}`.
pub fn chat_logprobs(tok: &Tokenizer, entries: &[TokenLogprobs]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = token_entry(tok, e.token, e.logprob);
            let top: Vec<Value> = (e.top.iter())
                .map(|&(id, lp)| token_entry(tok, id, lp))
                .collect();
            v["top_logprobs"] = Value::Array(top);
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`; each
/// `top_logprobs` entry maps token text → log-probability over the top alternatives and the
/// sampled token (up to logprobs + 1 entries, as vLLM). `offset` (characters of completion text
/// so far) advances by each token's text.
pub fn completion_logprobs(
    tok: &Tokenizer,
    entries: &[TokenLogprobs],
    offset: &mut usize,
) -> Value {
    let (mut tokens, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for e in entries {
        let text = token_text(Some(tok), e.token);
        let mut top = Map::new();
        for &(id, lp) in &e.top {
            top.entry(token_text(Some(tok), id)).or_insert(json!(lp));
        }
        top.entry(text.clone()).or_insert(json!(e.logprob));
        offsets.push(*offset);
        *offset += text.chars().count();
        tokens.push(text);
        lps.push(e.logprob);
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// The envelope of every body: id, object, created, model.
fn envelope(meta: &Meta, streamed: bool, choices: Vec<Value>) -> Value {
    let object = match (meta.endpoint, streamed) {
        (Endpoint::Chat, false) => "chat.completion",
        (Endpoint::Chat, true) => "chat.completion.chunk",
        (Endpoint::Completion, _) => "text_completion",
    };
    json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": null,
        "choices": choices,
    })
}

/// One streamed chunk for choice `index`: `text` (chat: with the role when `first`), its
/// logprobs (already laid out), and the finish reason on the last.
pub fn chunk(
    meta: &Meta,
    index: usize,
    text: &str,
    first: bool,
    logprobs: Option<Value>,
    finish: Option<FinishReason>,
) -> Value {
    let finish = finish.map(finish_reason);
    let choice = match meta.endpoint {
        Endpoint::Chat => {
            let delta = match (first, finish.is_some() && text.is_empty()) {
                (true, _) => json!({"role": "assistant", "content": text}),
                (false, true) => json!({}),
                (false, false) => json!({"content": text}),
            };
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
        }
        Endpoint::Completion => {
            json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
        }
    };
    let mut v = envelope(meta, true, vec![choice]);
    if meta.include_usage {
        v["usage"] = Value::Null;
    }
    v
}

/// The last chunk of a stream with `include_usage`: no choices, the usage.
pub fn usage_chunk(meta: &Meta, prompt_tokens: usize, completion_tokens: usize) -> Value {
    let mut v = envelope(meta, true, Vec::new());
    v["usage"] = usage(prompt_tokens, completion_tokens);
    v
}

/// A whole (non-streaming) response.
pub fn full(meta: &Meta, tok: &Tokenizer, choices: &[ChoiceOut], prompt_tokens: usize) -> Value {
    let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
    let out: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let finish = c.finish_reason.map(finish_reason);
            let logprobs = meta.logprobs.map(|_| match meta.endpoint {
                Endpoint::Chat => chat_logprobs(tok, &c.logprobs),
                Endpoint::Completion => completion_logprobs(tok, &c.logprobs, &mut 0),
            });
            match meta.endpoint {
                Endpoint::Chat => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": c.text, "refusal": null},
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }),
                Endpoint::Completion => json!({
                    "index": i,
                    "text": c.text,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }),
            }
        })
        .collect();
    let mut v = envelope(meta, false, out);
    v["usage"] = usage(prompt_tokens, completion);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer_fixture::TokFixture;

    fn meta(endpoint: Endpoint, include_usage: bool) -> Meta {
        Meta {
            endpoint,
            id: "x-1".into(),
            created: 7,
            model: "m".into(),
            logprobs: Some(1),
            include_usage,
        }
    }

    #[test]
    fn chunks_and_bodies_have_openais_shape() {
        let m = meta(Endpoint::Chat, true);
        let c = chunk(&m, 1, "", true, None, None);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(
            c["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert_eq!(c["usage"], Value::Null);
        assert!(c.as_object().unwrap().contains_key("usage"));
        let c = chunk(&m, 1, "", false, None, Some(FinishReason::Length));
        assert_eq!(
            (
                c["choices"][0]["delta"].clone(),
                c["choices"][0]["finish_reason"].clone()
            ),
            (json!({}), json!("length"))
        );
        let u = usage_chunk(&m, 3, 4);
        assert_eq!(u["choices"], json!([]));
        assert_eq!(
            u["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})
        );
        let m = meta(Endpoint::Completion, false);
        let c = chunk(&m, 0, "hi", false, None, None);
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["choices"][0]["text"], "hi");
        assert!(!c.as_object().unwrap().contains_key("usage"));
    }

    #[test]
    fn logprobs_layouts() {
        let tok = TokFixture::default().build();
        let ids = tok.encode("hi there", false).unwrap();
        let e: Vec<TokenLogprobs> = ids
            .iter()
            .map(|&id| TokenLogprobs {
                token: id,
                logprob: -0.5,
                top: vec![(id, -0.5), (3, -2.0)],
            })
            .collect();
        let chat = chat_logprobs(&tok, &e);
        let first = &chat["content"][0];
        let t0 = tok.decode(&ids[..1], false);
        assert_eq!(first["token"], t0.as_str());
        assert_eq!(first["bytes"], json!(t0.as_bytes()));
        assert_eq!(first["top_logprobs"].as_array().unwrap().len(), 2);
        let mut off = 0;
        let c = completion_logprobs(&tok, &e, &mut off);
        assert_eq!(c["tokens"].as_array().unwrap().len(), ids.len());
        assert_eq!(c["text_offset"][0], 0);
        assert_eq!(c["text_offset"][1], t0.chars().count());
        assert_eq!(c["top_logprobs"][0][t0.as_str()], -0.5);
        let full_len: usize = ids
            .iter()
            .map(|&i| tok.decode(&[i], false).chars().count())
            .sum();
        assert_eq!(off, full_len);
    }
}
