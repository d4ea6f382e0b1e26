//! Request identity and the events a request's stream carries back to its session.

use serde::Serialize;

/// Engine-wide request id (the client's `id` is only unique per socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// eos, a stop token id or a stop string.
    Stop,
    /// max_tokens or the model's context length.
    Length,
    /// the client cancelled or went away.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Timing {
    pub queue_ms: f64,
    /// None (`null`): no token came (cancelled or failed before the first).
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
}

/// One output token's log-probabilities, for requests that ask (`params.logprobs`): the
/// model's own distribution (raw logits, temperature 1), as vLLM and OpenAI report them.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The `params.logprobs` most likely tokens, (id, log-probability), most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What flows from the scheduler to a session for one request, over a bounded channel.
/// At most one `Delta` per engine step; exactly one terminal event (`Done` or `Error`).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Started {
        prompt_tokens: usize,
    },
    /// `index`: the choice (0 unless the request asked for `n > 1`).
    Delta {
        index: usize,
        text: String,
        tokens: usize,
        /// One entry per token this delta counts, for requests with `params.logprobs`; else
        /// empty.
        logprobs: Vec<TokenLogprobs>,
    },
    /// One choice of an `n > 1` request ended while others still run (not terminal).
    ChoiceDone {
        index: usize,
        finish_reason: FinishReason,
        completion_tokens: usize,
    },
    /// The request ended: with `n > 1`, its last choice (`index`); `usage` counts every
    /// choice's completion tokens.
    Done {
        index: usize,
        finish_reason: FinishReason,
        usage: Usage,
        timing: Timing,
    },
    Error(crate::error::EngineError),
}

impl StreamEvent {
    pub fn is_terminal(&self) -> bool {
        matches!(self, StreamEvent::Done { .. } | StreamEvent::Error(_))
    }
}
