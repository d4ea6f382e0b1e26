//! The engine requests behind one API request: one per prompt, each asking the engine for the
//! request's `n` choices. The engine forks them off one prefill (shared prompt blocks,
//! copy-on-write of the partial last block; `scheduler::core::tiers`), the path WebSocket `n`
//! takes, and choice i samples on `sample_seed(seed, i)` (choice 0 on the seed itself).
//! Dropping [`Choices`] aborts every request that has not ended (all its choices), so a client
//! that goes away (a dropped response stream, a dropped handler) frees its KV blocks.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::mpsc;

use crate::engine::EngineHandle;
use crate::error::EngineError;
use crate::request::{FinishReason, RequestId, StreamEvent, TokenLogprobs};
use crate::validation::ValidRequest;

/// What the response needs of one choice's stream.
#[derive(Debug)]
pub enum ChoiceEvent {
    Delta {
        text: String,
        logprobs: Vec<TokenLogprobs>,
    },
    /// The choice ended: its own completion tokens (the engine's `done` counts every choice of
    /// a prompt; this is split back per choice).
    Finished {
        finish_reason: FinishReason,
        completion_tokens: usize,
    },
    /// The engine failed the prompt's request: every choice of it ends with this one event.
    Error(EngineError),
}

/// One API request's engine requests, one per prompt; choices in response order
/// (prompt-major, then choice: index = prompt × n + choice).
pub struct Choices {
    engine: Arc<EngineHandle>,
    /// Per prompt: its request's id (its choices are `id .. id + n`; aborting `id` aborts all).
    ids: Vec<RequestId>,
    /// Per prompt; None once the request's terminal event was taken.
    rxs: Vec<Option<mpsc::Receiver<StreamEvent>>>,
    /// Per prompt: completion tokens of its choices that ended before the last.
    ended_tokens: Vec<usize>,
    /// Choices per prompt.
    pub n: usize,
    /// Where polling resumes, so no prompt starves the others.
    next: usize,
}

impl Choices {
    /// Submits every prompt's request (each carries its `n`, the same for all: the API's).
    pub fn submit(engine: Arc<EngineHandle>, reqs: &[ValidRequest]) -> Self {
        let n = reqs.first().map_or(1, ValidRequest::n);
        debug_assert!(reqs.iter().all(|r| r.n() == n), "one `n` per API request");
        let (ids, rxs) = reqs
            .iter()
            .map(|r| {
                let (id, rx) = engine.submit(r.clone());
                (id, Some(rx))
            })
            .unzip();
        Choices {
            engine,
            ids,
            rxs,
            ended_tokens: vec![0; reqs.len()],
            n,
            next: 0,
        }
    }

    /// Choices over all prompts.
    pub fn count(&self) -> usize {
        self.ids.len() * self.n
    }

    /// Waits for every prompt's admission: its prompt length (`Started`, one per prompt
    /// whatever its `n`), or the first refusal (`overloaded`), after which the rest are
    /// aborted (by the caller dropping `self`).
    pub async fn admitted(&mut self) -> Result<Vec<usize>, EngineError> {
        let mut prompt_tokens = Vec::with_capacity(self.ids.len());
        for i in 0..self.ids.len() {
            let rx = self.rxs[i].as_mut().expect("admission comes first");
            match rx.recv().await {
                Some(StreamEvent::Started { prompt_tokens: p }) => prompt_tokens.push(p),
                Some(StreamEvent::Error(e)) => {
                    self.rxs[i] = None;
                    return Err(e);
                }
                Some(other) => {
                    return Err(EngineError::Internal(format!(
                        "a request began with {other:?}"
                    )))
                }
                None => return Err(gone()),
            }
        }
        Ok(prompt_tokens)
    }

    /// The next event of any choice, as (choice index, event); None once every request ended.
    /// A channel that closes without a terminal event yields `unavailable` for its prompt.
    pub async fn next(&mut self) -> Option<(usize, ChoiceEvent)> {
        poll_fn(|cx| {
            let k = self.rxs.len();
            let mut open = false;
            for step in 0..k {
                let p = (self.next + step) % k;
                while let Some(rx) = self.rxs[p].as_mut() {
                    open = true;
                    let ev = match rx.poll_recv(cx) {
                        Poll::Pending => break,
                        Poll::Ready(Some(ev)) => ev,
                        Poll::Ready(None) => StreamEvent::Error(gone()),
                    };
                    if ev.is_terminal() {
                        self.rxs[p] = None;
                    }
                    if let Some((c, out)) = self.choice_event(p, ev) {
                        self.next = (p + 1) % k;
                        return Poll::Ready(Some((p * self.n + c, out)));
                    }
                }
            }
            if open {
                Poll::Pending
            } else {
                Poll::Ready(None)
            }
        })
        .await
    }

    /// Prompt `p`'s engine event as (choice within the prompt, event); None for what the
    /// response does not show (`started`).
    fn choice_event(&mut self, p: usize, ev: StreamEvent) -> Option<(usize, ChoiceEvent)> {
        Some(match ev {
            StreamEvent::Started { .. } => return None,
            StreamEvent::Delta {
                index,
                text,
                logprobs,
                ..
            } => (index, ChoiceEvent::Delta { text, logprobs }),
            StreamEvent::ChoiceDone {
                index,
                finish_reason,
                completion_tokens,
            } => {
                self.ended_tokens[p] += completion_tokens;
                let ev = ChoiceEvent::Finished {
                    finish_reason,
                    completion_tokens,
                };
                (index, ev)
            }
            StreamEvent::Done {
                index,
                finish_reason,
                usage,
                ..
            } => {
                let completion_tokens =
                    usage.completion_tokens.saturating_sub(self.ended_tokens[p]);
                let ev = ChoiceEvent::Finished {
                    finish_reason,
                    completion_tokens,
                };
                (index, ev)
            }
            StreamEvent::Error(e) => (0, ChoiceEvent::Error(e)),
        })
    }
}

fn gone() -> EngineError {
    EngineError::Unavailable("the scheduler dropped the request".into())
}

impl Drop for Choices {
    fn drop(&mut self) {
        let open: Vec<RequestId> = (self.ids.iter().zip(&self.rxs))
            .filter(|(_, rx)| rx.is_some())
            .map(|(&id, _)| id)
            .collect();
        if !open.is_empty() {
            self.engine.abort(open);
        }
    }
}
