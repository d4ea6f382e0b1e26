//! Per-connection limits of the WebSocket edge (configs/brook.toml, `[server]`): message size,
//! request rate (a token bucket), idle timeout, and the server-wide connection count.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::ServerConfig;

#[derive(Debug, Clone, PartialEq)]
pub struct EdgeLimits {
    /// Largest message, one frame or the sum of its fragments (close 1009 beyond).
    pub max_message_bytes: usize,
    /// `None`: no rate limit.
    pub rate: Option<RateLimit>,
    /// Close a socket that sent no frame for this long; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// The server pings this often so live clients always have something to answer.
    pub ping_interval: Option<Duration>,
    /// Output a socket may leave unread before its requests end with `slow_consumer`.
    pub max_unread_bytes: usize,
    /// Then how long it gets to read its error and close frames before the connection is cut.
    pub slow_consumer_grace: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Messages per second refilled into the bucket.
    pub per_s: f64,
    /// Bucket size: the burst a connection may send at once.
    pub burst: f64,
    /// Refused messages in a row after which the socket is closed (1008); 0 = never.
    pub close_after: u32,
}

fn secs(s: f64) -> Option<Duration> {
    (s > 0.0).then(|| Duration::from_secs_f64(s))
}

impl EdgeLimits {
    pub fn from_config(c: &ServerConfig) -> Self {
        EdgeLimits {
            max_message_bytes: c.max_message_bytes,
            rate: (c.rate_limit_per_s > 0.0).then_some(RateLimit {
                per_s: c.rate_limit_per_s,
                burst: c.rate_limit_burst as f64,
                close_after: c.rate_limit_close_after,
            }),
            idle_timeout: secs(c.idle_timeout_s),
            ping_interval: secs(c.ping_interval_s),
            max_unread_bytes: c.max_unread_bytes,
            slow_consumer_grace: Duration::from_secs_f64(c.slow_consumer_grace_s),
        }
    }
}

/// A token bucket over explicit time (so it is tested without sleeping): full at start, one
/// token per message, refilled at `per_s`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    per_s: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(limit: &RateLimit, now: Instant) -> Self {
        TokenBucket {
            per_s: limit.per_s,
            burst: limit.burst.max(1.0),
            tokens: limit.burst.max(1.0),
            last: now,
        }
    }

    /// Takes one token, or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.per_s).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.per_s))
        }
    }
}

/// The server-wide count of open WebSocket connections, shared by all HTTP workers.
#[derive(Debug)]
pub struct ConnectionSlots {
    max: usize,
    open: AtomicUsize,
}

/// One open connection; dropping it (with its session) frees the slot.
#[derive(Debug)]
pub struct ConnectionSlot(Arc<ConnectionSlots>);

impl ConnectionSlots {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(ConnectionSlots {
            max,
            open: AtomicUsize::new(0),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A slot, or `None` when `max` are open. Atomic, so concurrent upgrades on several
    /// workers never exceed the limit.
    pub fn try_acquire(self: &Arc<Self>) -> Option<ConnectionSlot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| ConnectionSlot(self.clone()))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let limit = RateLimit {
            per_s: 10.0,
            burst: 3.0,
            close_after: 0,
        };
        let mut b = TokenBucket::new(&limit, t0);
        for _ in 0..3 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        // 50 ms later half a token is back: still refused, 50 ms to wait.
        let t1 = t0 + Duration::from_millis(50);
        let wait = b.take(t1).unwrap_err();
        assert!((wait.as_secs_f64() - 0.05).abs() < 1e-9, "{wait:?}");
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        // A long pause refills to the burst, not beyond.
        let t2 = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.take(t2).is_ok());
        }
        assert!(b.take(t2).is_err());
    }

    #[test]
    fn slots_are_bounded_and_freed_on_drop() {
        let slots = ConnectionSlots::new(2);
        let a = slots.try_acquire().unwrap();
        let b = slots.try_acquire().unwrap();
        assert!(slots.try_acquire().is_none());
        assert_eq!(slots.open(), 2);
        drop(a);
        let c = slots.try_acquire().unwrap();
        assert!(slots.try_acquire().is_none());
        drop((b, c));
        assert_eq!(slots.open(), 0);
    }

    #[test]
    fn zero_disables_rate_idle_and_ping() {
        let c = ServerConfig {
            rate_limit_per_s: 0.0,
            idle_timeout_s: 0.0,
            ping_interval_s: 0.0,
            ..Default::default()
        };
        let l = EdgeLimits::from_config(&c);
        assert_eq!(
            (l.rate, l.idle_timeout, l.ping_interval),
            (None, None, None)
        );
        let l = EdgeLimits::from_config(&ServerConfig::default());
        assert!(l.rate.is_some() && l.idle_timeout.is_some() && l.ping_interval.is_some());
    }
}
