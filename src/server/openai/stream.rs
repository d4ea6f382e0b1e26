//! Answers from a request's choices once they are admitted: a Server-Sent Events stream
//! (`data: {chunk}` per delta, a finish chunk per choice, the usage chunk when asked, then
//! `data: [DONE]`), or one JSON body. The stream owns the choices: when the client goes away
//! actix drops it, and dropping the choices aborts them (KV blocks freed).

use std::convert::Infallible;
use std::sync::Arc;

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::HttpResponse;
use serde_json::Value;

use super::choices::{ChoiceEvent, Choices};
use super::error::ApiError;
use super::request::Endpoint;
use super::response::{self, ChoiceOut, Meta};
use crate::engine::EngineHandle;

/// Prompt tokens of the usage: each prompt once, however many choices it has (as OpenAI;
/// `prompt_tokens` holds one entry per prompt, and the engine computed each once).
fn prompt_usage(prompt_tokens: &[usize]) -> usize {
    prompt_tokens.iter().sum()
}

fn sse_event(v: &Value) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, v).expect("JSON values always serialize");
    out.extend_from_slice(b"\n\n");
    out
}

const DONE: &[u8] = b"data: [DONE]\n\n";

struct Sse {
    meta: Meta,
    engine: Arc<EngineHandle>,
    /// None once the stream ended (an error aborts the other choices at once).
    choices: Option<Choices>,
    prompt_tokens: Vec<usize>,
    completion_tokens: usize,
    /// Per choice: characters of text so far (completions' `text_offset`).
    offsets: Vec<usize>,
    opened: bool,
}

impl Sse {
    /// The next piece of the body; None when it is complete.
    async fn next_bytes(&mut self) -> Option<Bytes> {
        let choices = self.choices.as_mut()?;
        if !self.opened {
            self.opened = true;
            // Chat streams open each choice with the assistant role, as OpenAI does.
            if self.meta.endpoint == Endpoint::Chat {
                let mut out = Vec::new();
                for i in 0..choices.count() {
                    out.extend(sse_event(&response::chunk(
                        &self.meta, i, "", true, None, None,
                    )));
                }
                return Some(out.into());
            }
        }
        loop {
            let Some((i, ev)) = choices.next().await else {
                // Every choice ended.
                let mut out = Vec::new();
                if self.meta.include_usage {
                    let prompt = prompt_usage(&self.prompt_tokens);
                    let u = response::usage_chunk(&self.meta, prompt, self.completion_tokens);
                    out.extend(sse_event(&u));
                }
                out.extend_from_slice(DONE);
                self.choices = None;
                return Some(out.into());
            };
            let chunk = match ev {
                ChoiceEvent::Delta { text, logprobs } => {
                    if text.is_empty() && logprobs.is_empty() {
                        continue;
                    }
                    let lp = self.logprobs(i, &logprobs);
                    self.offsets[i] += text.chars().count();
                    response::chunk(&self.meta, i, &text, false, lp, None)
                }
                ChoiceEvent::Finished {
                    finish_reason,
                    completion_tokens,
                } => {
                    self.completion_tokens += completion_tokens;
                    response::chunk(&self.meta, i, "", false, None, Some(finish_reason))
                }
                ChoiceEvent::Error(e) => {
                    // The engine failed this prompt's request: say so in the stream and end it; the
                    // other choices are aborted (dropped here).
                    self.engine.metrics.count_error(&e);
                    let mut out = sse_event(&ApiError::from(e).body());
                    out.extend_from_slice(DONE);
                    self.choices = None;
                    return Some(out.into());
                }
            };
            return Some(sse_event(&chunk).into());
        }
    }

    fn logprobs(&mut self, i: usize, entries: &[crate::request::TokenLogprobs]) -> Option<Value> {
        self.meta.logprobs?;
        let tok = &self.engine.tokenizer;
        Some(match self.meta.endpoint {
            Endpoint::Chat => response::chat_logprobs(tok, entries),
            Endpoint::Completion => {
                let mut at = self.offsets[i];
                response::completion_logprobs(tok, entries, &mut at)
            }
        })
    }
}

/// The streaming answer (`stream: true`).
pub fn sse(
    meta: Meta,
    engine: Arc<EngineHandle>,
    choices: Choices,
    prompt_tokens: Vec<usize>,
) -> HttpResponse {
    let k = choices.count();
    let state = Sse {
        meta,
        engine,
        choices: Some(choices),
        prompt_tokens,
        completion_tokens: 0,
        offsets: vec![0; k],
        opened: false,
    };
    let body = futures_util::stream::unfold(state, |mut st| async move {
        let bytes = st.next_bytes().await?;
        Some((Ok::<_, Infallible>(bytes), st))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body)
}

/// The whole answer (`stream: false`): every choice to its end. A failed prompt fails the
/// request (the others are aborted when `choices` drops).
pub async fn complete(
    meta: Meta,
    engine: &EngineHandle,
    mut choices: Choices,
    prompt_tokens: Vec<usize>,
) -> Result<HttpResponse, ApiError> {
    let mut out = vec![ChoiceOut::default(); choices.count()];
    while let Some((i, ev)) = choices.next().await {
        let c = &mut out[i];
        match ev {
            ChoiceEvent::Delta { text, logprobs } => {
                c.text.push_str(&text);
                c.logprobs.extend(logprobs);
            }
            ChoiceEvent::Finished {
                finish_reason,
                completion_tokens,
            } => {
                c.finish_reason = Some(finish_reason);
                c.completion_tokens = completion_tokens;
            }
            ChoiceEvent::Error(e) => return Err(e.into()),
        }
    }
    let prompt = prompt_usage(&prompt_tokens);
    let body = response::full(&meta, &engine.tokenizer, &out, prompt);
    Ok(HttpResponse::Ok().json(body))
}
