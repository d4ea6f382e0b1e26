//! The engine requests behind one API request: `n` choices per prompt, each its own request on
//! its own sample stream. Dropping [`Choices`] aborts every choice that has not ended, so a
//! client that goes away (a dropped response stream, a dropped handler) frees its KV blocks.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::mpsc;

use crate::engine::{EngineCore, EngineHandle};
use crate::error::EngineError;
use crate::request::{RequestId, StreamEvent};
use crate::validation::ValidRequest;

/// Submits the `n` choices of one prompt: the same request on distinct sample streams (choice
/// 0 keeps the request's seed, so `n = 1` is the plain request; choice i > 0 a seed derived
/// from it; without a seed each draws its own at admission). Submitted back to back, they share
/// the prompt's KV blocks through the prefix cache once the first has computed them.
///
/// The one place `n` is implemented: the KV tier's engine-level fork (shared prompt blocks,
/// one prefill) replaces this function.
pub fn fan_out(
    engine: &EngineCore,
    req: &ValidRequest,
    n: usize,
) -> Vec<(RequestId, mpsc::Receiver<StreamEvent>)> {
    (0..n)
        .map(|i| {
            let seed = req.params().seed.map(|s| choice_seed(s, i));
            engine.submit(req.with_seed(seed))
        })
        .collect()
}

/// Choice i's seed: the request's for choice 0, else a SplitMix64 mix of it and i.
fn choice_seed(seed: u64, i: usize) -> u64 {
    if i == 0 {
        return seed;
    }
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One API request's choices, in response order (prompt-major, then choice).
pub struct Choices {
    engine: Arc<EngineHandle>,
    ids: Vec<RequestId>,
    /// None once the choice's terminal event was taken.
    rxs: Vec<Option<mpsc::Receiver<StreamEvent>>>,
    /// Choices per prompt.
    pub n: usize,
    /// Where polling resumes, so no choice starves the others.
    next: usize,
}

impl Choices {
    /// Submits `n` choices of every request.
    pub fn submit(engine: Arc<EngineHandle>, reqs: &[ValidRequest], n: usize) -> Self {
        let (mut ids, mut rxs) = (Vec::new(), Vec::new());
        for r in reqs {
            for (id, rx) in fan_out(&engine, r, n) {
                ids.push(id);
                rxs.push(Some(rx));
            }
        }
        Choices {
            engine,
            ids,
            rxs,
            n,
            next: 0,
        }
    }

    /// Choices over all prompts.
    pub fn count(&self) -> usize {
        self.ids.len()
    }

    /// Waits for every choice's admission: its prompt length (`Started`), or the first
    /// refusal (`overloaded`), after which the rest are aborted (by the caller dropping `self`).
    pub async fn admitted(&mut self) -> Result<Vec<usize>, EngineError> {
        let mut prompt_tokens = Vec::with_capacity(self.count());
        for i in 0..self.count() {
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

    /// The next event of any choice, as (choice index, event); None once every choice ended.
    /// A channel that closes without a terminal event yields `unavailable` for its choice.
    pub async fn next(&mut self) -> Option<(usize, StreamEvent)> {
        poll_fn(|cx| {
            let k = self.rxs.len();
            let mut open = false;
            for step in 0..k {
                let i = (self.next + step) % k;
                let Some(rx) = self.rxs[i].as_mut() else {
                    continue;
                };
                open = true;
                let ev = match rx.poll_recv(cx) {
                    Poll::Pending => continue,
                    Poll::Ready(Some(ev)) => ev,
                    Poll::Ready(None) => StreamEvent::Error(gone()),
                };
                if ev.is_terminal() {
                    self.rxs[i] = None;
                }
                self.next = (i + 1) % k;
                return Poll::Ready(Some((i, ev)));
            }
            if open {
                Poll::Pending
            } else {
                Poll::Ready(None)
            }
        })
        .await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_seeds_keep_the_first_and_differ() {
        assert_eq!(choice_seed(42, 0), 42);
        let seeds: Vec<u64> = (0..16).map(|i| choice_seed(42, i)).collect();
        let mut d = seeds.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 16);
        assert_eq!(choice_seed(42, 3), choice_seed(42, 3));
    }
}
