//! Output bytes one socket has not taken yet (text, and log-probabilities at an estimated size
//! an entry: `delta_bytes`): produced by the output processor for the socket's
//! requests (`produced`), taken by its session as it pulls events off their channels (`taken`).
//!
//! Why it is counted here and not at the socket: actix-web-actors' `WebsocketContext` exposes
//! nothing about its write side, and its actor only runs while the HTTP dispatcher polls the
//! response body, which it stops doing once ~32 KiB wait for a socket that does not drain. So a
//! client that stops reading freezes its session: the session stops pulling, each request's
//! bounded channel fills, and the processor merges text into pending deltas. What piles up is
//! exactly what this counts (the dispatcher's own buffer is bounded by actix); past `limit` the
//! processor fails the socket's requests with `slow_consumer`, freeing their KV, and `tripped`
//! wakes the session's watchdog, which cuts the connection if the frozen session never gets to
//! close it (session/mod.rs).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;
use tokio::sync::Notify;

use crate::request::TokenLogprobs;

/// What one log-probability entry of a delta frame counts for, the token's and each
/// alternative's (`{"id":…,"token":"…","logprob":…}`: ~40-50 bytes with a short token). Counted
/// beside the text, or a reader that asked for them could leave ~20× its limit unread.
pub const LOGPROB_ENTRY_BYTES: usize = 48;

/// What a delta counts for in its socket's backlog: its text and its log-probabilities.
pub fn delta_bytes(text: &str, logprobs: &[TokenLogprobs]) -> usize {
    let entries: usize = logprobs.iter().map(|l| 1 + l.top.len()).sum();
    text.len() + entries * LOGPROB_ENTRY_BYTES
}

#[derive(Debug)]
pub struct Backlog {
    bytes: AtomicUsize,
    limit: usize,
    tripped: AtomicBool,
    notify: Notify,
    /// Sum over live sockets (`brook:websocket_unread_bytes`).
    gauge: IntGauge,
}

impl Backlog {
    pub fn new(limit: usize, gauge: IntGauge) -> Arc<Self> {
        Arc::new(Backlog {
            bytes: AtomicUsize::new(0),
            limit,
            tripped: AtomicBool::new(false),
            notify: Notify::new(),
            gauge,
        })
    }

    /// `n` bytes produced for the socket. True exactly once: when this pushes it past the limit
    /// (the caller then fails the socket's requests).
    pub fn produced(&self, n: usize) -> bool {
        if n == 0 {
            return false;
        }
        self.gauge.add(n as i64);
        let now = self.bytes.fetch_add(n, Ordering::AcqRel) + n;
        if now > self.limit && !self.tripped.swap(true, Ordering::AcqRel) {
            self.notify.notify_one();
            return true;
        }
        false
    }

    /// `n` bytes taken by the session, or dropped unsent (their request ended without them).
    pub fn taken(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.gauge.sub(n as i64);
        self.bytes.fetch_sub(n, Ordering::AcqRel);
    }

    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn is_tripped(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    /// Resolves once the limit was passed (at once if it was already).
    pub async fn tripped(&self) {
        if !self.is_tripped() {
            self.notify.notified().await;
        }
    }
}

impl Drop for Backlog {
    /// Bytes still counted when the socket is gone leave the gauge with it.
    fn drop(&mut self) {
        self.gauge.sub(*self.bytes.get_mut() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_once_past_the_limit_and_the_gauge_follows() {
        let gauge = IntGauge::new("unread", "test").unwrap();
        let b = Backlog::new(100, gauge.clone());
        assert!(!b.produced(60));
        b.taken(50);
        assert!(!b.produced(90), "10 + 90 is at the limit, not past it");
        assert_eq!((b.bytes(), gauge.get()), (100, 100));
        assert!(b.produced(1));
        assert!(b.is_tripped());
        assert!(!b.produced(500), "trips once");
        let other = Backlog::new(100, gauge.clone());
        other.produced(7);
        assert_eq!(gauge.get(), 608);
        drop(b);
        assert_eq!(gauge.get(), 7);
        // Notified before anyone waits: the wait still ends.
        assert!(other.produced(200));
        futures_util::FutureExt::now_or_never(other.tripped()).expect("already tripped");
    }
}
