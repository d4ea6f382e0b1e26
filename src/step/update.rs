//! What `update_from_output` reports for each request after a step.

use crate::request::{FinishReason, RequestId, TokenLogprobs};

/// The change to one request after a step.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestUpdate {
    pub id: RequestId,
    /// Tokens generated this step: 0 or 1, or several when drafts were accepted (speculative
    /// decoding). An eos or stop token that ended the request is included (and nothing after
    /// it); the output processor decides whether to show it.
    pub new_token_ids: Vec<u32>,
    /// With `params.logprobs`: one entry per token of `new_token_ids`; else empty.
    pub logprobs: Vec<TokenLogprobs>,
    pub finished: Option<FinishReason>,
    /// Tokens with K/V in the cache after the step.
    pub num_computed_tokens: usize,
    /// Tokens generated so far, this step's included.
    pub num_output_tokens: usize,
}
