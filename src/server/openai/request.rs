//! `/v1/chat/completions` and `/v1/completions` bodies → the neutral `GenerateRequest`s that
//! `Validation::validate` takes (one per prompt), plus what the response needs (n, streaming,
//! usage, logprobs). Every field is either implemented, a known one this server refuses (400
//! naming it), or unknown (400): nothing is silently ignored. `null` counts as absent, as in
//! OpenAI's API.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::chat::{validate_messages, ChatMessage};
use crate::error::EngineError;
use crate::sampling::params::{RawSamplingParams, MAX_LOGPROBS};
use crate::validation::{GenerateRequest, PromptInput};

/// Most choices per prompt, and per request over all prompts.
pub const MAX_N: usize = 16;
pub const MAX_CHOICES: usize = 64;
/// OpenAI's default `max_tokens` of a completion.
pub const COMPLETION_DEFAULT_MAX_TOKENS: i64 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// Fields both endpoints implement (the last six are vLLM's extras).
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "stream",
    "stream_options",
    "user",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
];
const CHAT: &[&str] = &["messages", "max_completion_tokens", "top_logprobs"];
const COMPLETION: &[&str] = &["prompt", "echo", "best_of", "suffix"];
/// OpenAI chat fields this server does not implement.
const CHAT_UNSUPPORTED: &[&str] = &[
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "response_format",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "service_tier",
    "store",
    "metadata",
    "web_search_options",
];

/// A parsed request, before validation.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub model: String,
    /// One per prompt (a completion may have several; a chat has one).
    /// Each carries the request's `n` (choices per prompt).
    pub requests: Vec<GenerateRequest>,
    pub stream: bool,
    pub include_usage: bool,
    /// Some(k): report log-probabilities with k alternatives per token.
    pub logprobs: Option<usize>,
    /// The end user the client names (logged).
    pub user: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// Request fields, read one at a time so errors name the field.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ApiError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|e| ApiError::invalid(name, format!("`{name}`: {e}"))),
        }
    }

    fn present(&self, name: &str) -> bool {
        !matches!(self.0.get(name), None | Some(Value::Null))
    }
}

/// Parses a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError {
        error: EngineError::InvalidJson(e.to_string()),
        param: None,
    })?;
    let obj = value.as_object().ok_or_else(|| ApiError {
        error: EngineError::invalid("the request body must be a JSON object"),
        param: None,
    })?;
    let f = Fields(obj);
    let own = match endpoint {
        Endpoint::Chat => CHAT,
        Endpoint::Completion => COMPLETION,
    };
    for key in obj.keys() {
        if COMMON.contains(&key.as_str()) || own.contains(&key.as_str()) {
            continue;
        }
        if CHAT_UNSUPPORTED.contains(&key.as_str()) {
            if f.present(key) {
                return Err(ApiError::unsupported(key));
            }
            continue;
        }
        return Err(ApiError::invalid(
            key,
            format!("unrecognized request argument supplied: {key}"),
        ));
    }
    let model: String = f
        .get("model")?
        .ok_or_else(|| ApiError::invalid("model", "you must provide a `model` parameter"))?;
    let n = f.get::<i64>("n")?.unwrap_or(1);
    if !(1..=MAX_N as i64).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    let n = n as usize;
    let stream = f.get::<bool>("stream")?.unwrap_or(false);
    let include_usage = match f.get::<StreamOptions>("stream_options")? {
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` is only allowed when `stream` is true",
            ))
        }
        Some(o) => o.include_usage.unwrap_or(false),
        None => false,
    };
    let mut params = common_params(&f)?;
    let (inputs, logprobs) = match endpoint {
        Endpoint::Chat => chat_fields(&f, &mut params)?,
        Endpoint::Completion => completion_fields(&f, &mut params, n)?,
    };
    params.logprobs = logprobs.map(|k| k as i64);
    if inputs.len() * n > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!(
                "{} prompts x n = {n} choices; at most {MAX_CHOICES} per request",
                inputs.len()
            ),
        ));
    }
    Ok(Parsed {
        model,
        requests: inputs
            .into_iter()
            .map(|input| GenerateRequest {
                input,
                params: params.clone(),
                // The engine forks the `n` choices off one prefill (`choices`).
                n: Some(n as i64),
            })
            .collect(),
        stream,
        include_usage,
        logprobs,
        user: f.get("user")?,
    })
}

/// The sampling fields both endpoints share.
fn common_params(f: &Fields) -> Result<RawSamplingParams, ApiError> {
    let stop = match f.get::<Value>("stop")? {
        None => None,
        Some(Value::String(s)) => Some(vec![s]),
        Some(v) => Some(serde_json::from_value::<Vec<String>>(v).map_err(|_| {
            ApiError::invalid("stop", "`stop` must be a string or a list of strings")
        })?),
    };
    // vLLM's convention: top_k -1 (or 0) is off.
    let top_k = f.get::<i64>("top_k")?.map(|k| if k == -1 { 0 } else { k });
    Ok(RawSamplingParams {
        max_tokens: f.get("max_tokens")?,
        temperature: f.get("temperature")?,
        top_p: f.get("top_p")?,
        top_k,
        min_p: f.get("min_p")?,
        // OpenAI seeds are any 64-bit integer; brook's streams take their bits.
        seed: f.get::<i64>("seed")?.map(|s| s as u64),
        stop,
        stop_token_ids: f.get("stop_token_ids")?,
        ignore_eos: f.get("ignore_eos")?,
        presence_penalty: f.get("presence_penalty")?,
        frequency_penalty: f.get("frequency_penalty")?,
        repetition_penalty: f.get("repetition_penalty")?,
        logit_bias: f.get::<BTreeMap<String, f64>>("logit_bias")?,
        min_tokens: f.get("min_tokens")?,
        logprobs: None,
        // The server's speculation setting (brook's WS field has no OpenAI counterpart).
        speculative: None,
    })
}

/// Chat: messages, max_completion_tokens, logprobs (bool) with top_logprobs.
fn chat_fields(
    f: &Fields,
    params: &mut RawSamplingParams,
) -> Result<(Vec<PromptInput>, Option<usize>), ApiError> {
    let messages = parse_messages(f.0.get("messages").unwrap_or(&Value::Null))?;
    if let Some(m) = f.get::<i64>("max_completion_tokens")? {
        if params.max_tokens.is_some_and(|t| t != m) {
            return Err(ApiError::invalid(
                "max_tokens",
                "give `max_completion_tokens` or `max_tokens`, not both with different values",
            ));
        }
        params.max_tokens = Some(m);
    }
    let top = f.get::<i64>("top_logprobs")?;
    let logprobs = match (f.get::<bool>("logprobs")?.unwrap_or(false), top) {
        (_, Some(k)) if !(0..=MAX_LOGPROBS as i64).contains(&k) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("`top_logprobs` must be between 0 and {MAX_LOGPROBS}, got {k}"),
            ))
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs` set to true",
            ))
        }
        (true, k) => Some(k.unwrap_or(0) as usize),
        (false, None) => None,
    };
    Ok((vec![PromptInput::Messages(messages)], logprobs))
}

/// Completions: prompt(s), logprobs (a count), and echo / best_of / suffix at their defaults.
fn completion_fields(
    f: &Fields,
    params: &mut RawSamplingParams,
    n: usize,
) -> Result<(Vec<PromptInput>, Option<usize>), ApiError> {
    if f.get::<bool>("echo")?.unwrap_or(false) {
        return Err(ApiError::unsupported("echo"));
    }
    if f.present("suffix") {
        return Err(ApiError::unsupported("suffix"));
    }
    if f.get::<i64>("best_of")?.is_some_and(|b| b != n as i64) {
        return Err(ApiError::invalid(
            "best_of",
            "`best_of` other than `n` is not supported by this server",
        ));
    }
    params.max_tokens = params.max_tokens.or(Some(COMPLETION_DEFAULT_MAX_TOKENS));
    let logprobs = match f.get::<i64>("logprobs")? {
        None => None,
        Some(k) if (0..=MAX_LOGPROBS as i64).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("`logprobs` must be between 0 and {MAX_LOGPROBS}, got {k}"),
            ))
        }
    };
    let bad = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, a list of strings, a list of token ids or a list of \
             lists of token ids, not empty",
        )
    };
    let prompt = f
        .get::<Value>("prompt")?
        .ok_or_else(|| ApiError::invalid("prompt", "you must provide a `prompt`"))?;
    let inputs = match prompt {
        Value::String(s) => vec![PromptInput::Text(s)],
        Value::Array(items) if items.is_empty() => return Err(bad()),
        Value::Array(items) => match &items[0] {
            Value::String(_) => (serde_json::from_value::<Vec<String>>(Value::Array(items)))
                .map_err(|_| bad())?
                .into_iter()
                .map(PromptInput::Text)
                .collect(),
            Value::Number(_) => vec![PromptInput::Tokens(token_ids(&items, "prompt")?)],
            Value::Array(_) => (items.iter().enumerate())
                .map(|(i, list)| match list {
                    Value::Array(ids) if !ids.is_empty() => {
                        token_ids(ids, &format!("prompt[{i}]")).map(PromptInput::Tokens)
                    }
                    _ => Err(bad()),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    Ok((inputs, logprobs))
}

/// A prompt's list of token ids (`at`: where it is in `prompt`), naming the first element that
/// is not one (the vocabulary's bound is checked with the prompt, after this).
fn token_ids(items: &[Value], at: &str) -> Result<Vec<u32>, ApiError> {
    (items.iter().enumerate())
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "prompt",
                        format!("`{at}[{i}]` must be a token id (an integer from 0), got {v}"),
                    )
                })
        })
        .collect()
}

/// Chat messages: `role` and `content` (a string, or a list of text parts); `developer` is
/// rendered as `system`. Names, tool calls and non-text parts are refused.
fn parse_messages(value: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let list = value
        .as_array()
        .ok_or_else(|| ApiError::invalid("messages", "`messages` must be a list of messages"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].{field}");
        let obj = m.as_object().ok_or_else(|| {
            ApiError::invalid("messages", format!("messages[{i}] must be an object"))
        })?;
        for (k, v) in obj {
            match k.as_str() {
                "role" | "content" => {}
                _ if v.is_null() => {}
                "name" | "tool_calls" | "tool_call_id" | "function_call" | "refusal" | "audio" => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!("`{}` is not supported by this server", at(k)),
                    ))
                }
                _ => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!("{} is not a message field", at(k)),
                    ))
                }
            }
        }
        let role = match obj.get("role") {
            Some(Value::String(r)) if r == "developer" => "system".to_owned(),
            Some(Value::String(r)) => r.clone(),
            _ => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{} must be a string", at("role")),
                ))
            }
        };
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(parts, &at("content"))?,
            _ => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{} must be a string or a list of text parts", at("content")),
                ))
            }
        };
        out.push(ChatMessage { role, content });
    }
    validate_messages(&out).map_err(|e| ApiError::from(EngineError::from(e)))?;
    Ok(out)
}

/// `[{"type": "text", "text": …}, …]` joined by newlines (as vLLM does).
fn text_parts(parts: &[Value], at: &str) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("text"), Some(Value::String(t)))
                if p.as_object().is_some_and(|o| o.len() == 2) =>
            {
                texts.push(t.as_str())
            }
            (Some(kind), _) if kind != "text" => {
                return Err(ApiError::invalid(
                    "messages",
                    format!(
                        "{at}[{j}]: content parts of type {kind:?} are not supported; only text"
                    ),
                ))
            }
            _ => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{at}[{j}] must be {{\"type\": \"text\", \"text\": <string>}}"),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

#[cfg(test)]
mod tests;
