//! WebSocket JSON frames (docs/PROTOCOL.md). Parsing turns any bad frame into an `EngineError`
//! that names the problem, with the request id when one could be read.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::chat::parse_messages;
use crate::error::EngineError;
use crate::request::{FinishReason, StreamEvent, Timing, TokenLogprobs, Usage};
use crate::sampling::params::RawSamplingParams;
use crate::tokenizer::Tokenizer;
use crate::validation::{GenerateRequest, PromptInput};

pub const MAX_ID_LEN: usize = 256;

#[derive(Debug, Clone)]
pub enum ClientFrame {
    /// Boxed: the sampling params make it large beside `Cancel`.
    Generate(Box<GenerateFrame>),
    Cancel {
        id: String,
    },
}

#[derive(Debug, Clone)]
pub struct GenerateFrame {
    pub id: String,
    pub input: PromptInput,
    pub params: RawSamplingParams,
    /// Completions to generate (parallel sampling); None = 1.
    pub n: Option<i64>,
}

/// The WS frame without its id is the neutral request `Validation::validate` takes.
impl From<GenerateFrame> for GenerateRequest {
    fn from(frame: GenerateFrame) -> Self {
        GenerateRequest {
            input: frame.input,
            params: frame.params,
            n: frame.n,
        }
    }
}

// Every field is optional here so that `from_object` can check fields one at a time; presence
// is checked after.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGenerate {
    #[serde(rename = "type")]
    _type: Option<String>,
    id: Option<Value>,
    prompt: Option<String>,
    messages: Option<Value>,
    params: Option<Map<String, Value>>,
    n: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCancel {
    #[serde(rename = "type")]
    _type: Option<String>,
    id: Option<Value>,
}

/// Deserializes an object; on failure, finds the first field that fails on its own so the
/// message names it (serde's own message often does not).
fn from_object<T: DeserializeOwned>(obj: &Map<String, Value>, prefix: &str) -> Result<T, String> {
    serde_json::from_value(Value::Object(obj.clone())).map_err(|whole| {
        for (k, v) in obj {
            let one = Map::from_iter([(k.clone(), v.clone())]);
            if let Err(e) = serde_json::from_value::<T>(Value::Object(one)) {
                return format!("field `{prefix}{k}`: {e}");
            }
        }
        whole.to_string()
    })
}

/// A parse failure: the error plus the request id when the frame carried a readable one.
#[derive(Debug)]
pub struct FrameError {
    pub id: Option<String>,
    pub error: EngineError,
}

fn invalid(id: Option<String>, msg: impl Into<String>) -> FrameError {
    FrameError {
        id,
        error: EngineError::invalid(msg),
    }
}

fn read_id(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) if !s.is_empty() && s.chars().count() <= MAX_ID_LEN => Ok(s.clone()),
        Value::String(_) => Err(format!(
            "field `id` must be a string of 1 to {MAX_ID_LEN} characters"
        )),
        _ => Err("field `id` must be a string".into()),
    }
}

pub fn parse_client_frame(text: &str) -> Result<ClientFrame, FrameError> {
    let value: Value = serde_json::from_str(text).map_err(|e| FrameError {
        id: None,
        error: EngineError::InvalidJson(e.to_string()),
    })?;
    let obj = value
        .as_object()
        .ok_or_else(|| invalid(None, "frame must be a JSON object"))?;
    // An id we can read lets the error frame name the request it belongs to.
    let id = obj.get("id").and_then(|v| read_id(v).ok());
    let kind = match obj.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(_) => return Err(invalid(id, "field `type` must be a string")),
        None => return Err(invalid(id, "missing field `type`")),
    };
    match kind.as_str() {
        "generate" => {
            let raw: RawGenerate = from_object(obj, "").map_err(|m| invalid(id.clone(), m))?;
            let id =
                read_id(raw.id.as_ref().unwrap_or(&Value::Null)).map_err(|m| invalid(None, m))?;
            let params = match &raw.params {
                Some(p) => from_object(p, "params.").map_err(|m| invalid(Some(id.clone()), m))?,
                None => RawSamplingParams::default(),
            };
            let input = match (raw.prompt, raw.messages) {
                (Some(p), None) => PromptInput::Text(p),
                (None, Some(m)) => PromptInput::Messages(
                    parse_messages(&m).map_err(|e| invalid(Some(id.clone()), e.to_string()))?,
                ),
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        Some(id),
                        "give either `prompt` or `messages`, not both",
                    ))
                }
                (None, None) => {
                    return Err(invalid(Some(id), "missing field `prompt` or `messages`"))
                }
            };
            Ok(ClientFrame::Generate(Box::new(GenerateFrame {
                id,
                input,
                params,
                n: raw.n,
            })))
        }
        "cancel" => {
            let raw: RawCancel = from_object(obj, "").map_err(|m| invalid(id.clone(), m))?;
            let id =
                read_id(raw.id.as_ref().unwrap_or(&Value::Null)).map_err(|m| invalid(None, m))?;
            Ok(ClientFrame::Cancel { id })
        }
        other => Err(invalid(
            id,
            format!("unknown frame type {other:?}; expected \"generate\" or \"cancel\""),
        )),
    }
}

/// One token's log-probability in a `delta` frame, and its `top` alternatives.
#[derive(Debug, Serialize)]
pub struct LogprobFrame {
    pub id: u32,
    pub token: String,
    pub logprob: f32,
    pub top: Vec<TopLogprobFrame>,
}

#[derive(Debug, Serialize)]
pub struct TopLogprobFrame {
    pub id: u32,
    pub token: String,
    pub logprob: f32,
}

/// A token id's text: its decode with special tokens kept (empty without a tokenizer).
pub fn token_text(tok: Option<&Tokenizer>, id: u32) -> String {
    tok.map(|t| t.decode(&[id], false)).unwrap_or_default()
}

impl LogprobFrame {
    fn new(l: &TokenLogprobs, tok: Option<&Tokenizer>) -> Self {
        LogprobFrame {
            id: l.token,
            token: token_text(tok, l.token),
            logprob: l.logprob,
            top: (l.top.iter())
                .map(|&(id, logprob)| TopLogprobFrame {
                    id,
                    token: token_text(tok, id),
                    logprob,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ServerFrame<'a> {
    Started {
        id: &'a str,
        prompt_tokens: usize,
    },
    Delta {
        id: &'a str,
        /// The choice (0 unless the request asked for `n > 1`).
        index: usize,
        text: &'a str,
        tokens: usize,
        /// Requests with `params.logprobs` only: one entry per token counted.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        logprobs: Vec<LogprobFrame>,
    },
    /// One choice of an `n > 1` request ended; others still run.
    #[serde(rename = "choice_done")]
    ChoiceDone {
        id: &'a str,
        index: usize,
        finish_reason: FinishReason,
        completion_tokens: usize,
    },
    Done {
        id: &'a str,
        index: usize,
        finish_reason: FinishReason,
        usage: Usage,
        timing: Timing,
    },
    Error {
        id: Option<&'a str>,
        code: &'static str,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
    },
}

impl<'a> ServerFrame<'a> {
    pub fn error(id: Option<&'a str>, err: &EngineError) -> Self {
        ServerFrame::Error {
            id,
            code: err.code(),
            message: err.to_string(),
            retry_after_ms: err.retry_after_ms(),
        }
    }

    /// `tok` spells out the tokens of log-probabilities (empty strings without one).
    pub fn from_event(id: &'a str, ev: &'a StreamEvent, tok: Option<&Tokenizer>) -> Self {
        match ev {
            StreamEvent::Started { prompt_tokens } => ServerFrame::Started {
                id,
                prompt_tokens: *prompt_tokens,
            },
            StreamEvent::Delta {
                index,
                text,
                tokens,
                logprobs,
            } => ServerFrame::Delta {
                id,
                index: *index,
                text,
                tokens: *tokens,
                logprobs: logprobs.iter().map(|l| LogprobFrame::new(l, tok)).collect(),
            },
            StreamEvent::ChoiceDone {
                index,
                finish_reason,
                completion_tokens,
            } => ServerFrame::ChoiceDone {
                id,
                index: *index,
                finish_reason: *finish_reason,
                completion_tokens: *completion_tokens,
            },
            StreamEvent::Done {
                index,
                finish_reason,
                usage,
                timing,
            } => ServerFrame::Done {
                id,
                index: *index,
                finish_reason: *finish_reason,
                usage: *usage,
                timing: *timing,
            },
            StreamEvent::Error(e) => ServerFrame::error(Some(id), e),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("server frames always serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> FrameError {
        parse_client_frame(text).unwrap_err()
    }

    #[test]
    fn parses_generate_with_prompt_and_params() {
        let f = parse_client_frame(
            r#"{"type":"generate","id":"r1","prompt":"hi","params":{"max_tokens":5,"seed":7}}"#,
        )
        .unwrap();
        match f {
            ClientFrame::Generate(g) => {
                assert_eq!(g.id, "r1");
                assert!(matches!(g.input, PromptInput::Text(ref p) if p == "hi"));
                assert_eq!(g.params.max_tokens, Some(5));
                assert_eq!(g.params.seed, Some(7));
            }
            _ => panic!("expected generate"),
        }
    }

    #[test]
    fn parses_generate_with_messages_and_cancel() {
        let f = parse_client_frame(
            r#"{"type":"generate","id":"a","messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap();
        assert!(
            matches!(f, ClientFrame::Generate(ref g) if matches!(g.input, PromptInput::Messages(ref m) if m.len() == 1))
        );
        let c = parse_client_frame(r#"{"type":"cancel","id":"a"}"#).unwrap();
        assert!(matches!(c, ClientFrame::Cancel { ref id } if id == "a"));
    }

    /// The id's limit is in characters, as documented, not in UTF-8 bytes.
    #[test]
    fn ids_are_limited_in_characters() {
        let cancel = |id: &str| parse_client_frame(&format!(r#"{{"type":"cancel","id":"{id}"}}"#));
        for c in ["x", "é", "😀"] {
            let at_limit = c.repeat(MAX_ID_LEN);
            assert!(
                matches!(cancel(&at_limit), Ok(ClientFrame::Cancel { ref id }) if *id == at_limit)
            );
            let e = cancel(&c.repeat(MAX_ID_LEN + 1)).unwrap_err();
            assert!(
                e.error.to_string().contains("1 to 256 characters"),
                "{}",
                e.error
            );
        }
    }

    #[test]
    fn bad_json_has_no_id() {
        let e = err("{nope");
        assert_eq!(e.error.code(), "invalid_json");
        assert!(e.id.is_none());
    }

    #[test]
    fn unknown_field_is_named_and_keeps_the_id() {
        let e = err(r#"{"type":"generate","id":"r9","prompt":"x","temperatur":1}"#);
        assert_eq!(e.error.code(), "invalid_request");
        assert_eq!(e.id.as_deref(), Some("r9"));
        assert!(e.error.to_string().contains("temperatur"), "{}", e.error);
        let e = err(r#"{"type":"generate","id":"r9","prompt":"x","params":{"top_q":1}}"#);
        assert!(e.error.to_string().contains("top_q"), "{}", e.error);
    }

    #[test]
    fn structural_errors() {
        // (frame, a word its error names)
        let cases = [
            (r#"[1,2]"#, "object"),
            (r#"{"id":"x"}"#, "type"),
            (r#"{"type":"dance","id":"x"}"#, "dance"),
            (r#"{"type":"generate","id":"x"}"#, "prompt"),
            (
                r#"{"type":"generate","id":"x","prompt":"a","messages":[]}"#,
                "not both",
            ),
            (r#"{"type":"generate","id":5,"prompt":"a"}"#, "id"),
            (r#"{"type":"generate","id":"","prompt":"a"}"#, "id"),
            (
                r#"{"type":"generate","id":"x","prompt":"a","params":{"max_tokens":"many"}}"#,
                "max_tokens",
            ),
            (r#"{"type":"generate","id":"x","prompt":7}"#, "`prompt`"),
            (
                r#"{"type":"generate","id":"x","prompt":"a","params":[1]}"#,
                "params",
            ),
            (r#"{"type":"cancel"}"#, "id"),
        ];
        for (frame, word) in cases {
            let e = err(frame).error.to_string();
            assert!(e.contains(word), "{frame}: {e}");
        }
    }

    #[test]
    fn server_frames_serialize_as_documented() {
        let ev = StreamEvent::Delta {
            index: 0,
            text: "hé".into(),
            tokens: 2,
            logprobs: Vec::new(),
        };
        assert_eq!(
            ServerFrame::from_event("r1", &ev, None).to_json(),
            r#"{"type":"delta","id":"r1","index":0,"text":"hé","tokens":2}"#
        );
        let ev = StreamEvent::ChoiceDone {
            index: 2,
            finish_reason: FinishReason::Stop,
            completion_tokens: 5,
        };
        assert_eq!(
            ServerFrame::from_event("r1", &ev, None).to_json(),
            r#"{"type":"choice_done","id":"r1","index":2,"finish_reason":"stop","completion_tokens":5}"#
        );
        let tok = crate::tokenizer_fixture::TokFixture::default().build();
        let hi = tok.encode("hi", false).unwrap()[0];
        let ev = StreamEvent::Delta {
            index: 0,
            text: "hi".into(),
            tokens: 1,
            logprobs: vec![TokenLogprobs {
                token: hi,
                logprob: -0.5,
                top: vec![(hi, -0.5)],
            }],
        };
        let j: Value =
            serde_json::from_str(&ServerFrame::from_event("r1", &ev, Some(&tok)).to_json())
                .unwrap();
        let text = tok.decode(&[hi], false);
        assert_eq!(
            j["logprobs"],
            serde_json::json!([{"id": hi, "token": text, "logprob": -0.5,
                                "top": [{"id": hi, "token": text, "logprob": -0.5}]}])
        );
        let e = EngineError::Overloaded {
            reason: "queue full".into(),
            retry_after_ms: 250,
        };
        let j: Value = serde_json::from_str(&ServerFrame::error(None, &e).to_json()).unwrap();
        assert_eq!(j["id"], Value::Null);
        assert_eq!(j["code"], "overloaded");
        assert_eq!(j["retry_after_ms"], 250);
        let done = StreamEvent::Done {
            index: 1,
            finish_reason: FinishReason::Length,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
            },
            timing: Timing {
                queue_ms: 1.0,
                ttft_ms: Some(2.0),
                total_ms: 3.0,
            },
        };
        let j: Value =
            serde_json::from_str(&ServerFrame::from_event("r", &done, None).to_json()).unwrap();
        assert_eq!(j["finish_reason"], "length");
        assert_eq!(j["index"], 1);
        assert_eq!(j["usage"]["completion_tokens"], 4);
        assert_eq!(j["timing"]["ttft_ms"], 2.0);
    }
}
