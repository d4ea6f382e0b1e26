//! Why the server closes a WebSocket: each reason maps to its RFC 6455 close code, a metric label
//! (`brook:websocket_closes_total{reason}`) and the reason text, in this one place.

use actix_web_actors::ws::{CloseCode, CloseReason};

/// A close frame's payload is at most 125 bytes: 2 for the code, 123 for the reason.
const MAX_REASON_BYTES: usize = 123;

#[derive(Debug, Clone, PartialEq)]
pub enum CloseWhy {
    /// No frame from the client for the idle timeout (1000).
    Idle { secs: u64 },
    /// RFC 6455 framing violated: a continuation without a start, a data frame inside a
    /// fragmented message, a control frame fragmented, bad opcode or reserved bits (1002).
    Protocol(String),
    /// A binary message; the API is JSON text only (1003).
    Binary,
    /// A text message that is not valid UTF-8, checked on the whole reassembled message (1007).
    InvalidUtf8,
    /// The client kept sending while rate limited (1008).
    RateLimit { refused: u32 },
    /// One frame, or the fragments of one message together, over `server.max_message_bytes` (1009).
    TooBig { limit: usize },
    /// The engine cannot take requests (1011).
    Internal(String),
    /// The server is draining and this socket's requests have ended (1001).
    ShuttingDown,
    /// The client left more than the limit of output unread; its requests were cancelled (1008).
    /// The socket's unread output passed `limit` bytes (by close time the session has taken
    /// what was queued, so only the limit says anything).
    SlowConsumer { limit: usize },
}

impl CloseWhy {
    pub fn code(&self) -> CloseCode {
        match self {
            CloseWhy::Idle { .. } => CloseCode::Normal,
            CloseWhy::Protocol(_) => CloseCode::Protocol,
            CloseWhy::Binary => CloseCode::Unsupported,
            CloseWhy::InvalidUtf8 => CloseCode::Invalid,
            CloseWhy::RateLimit { .. } => CloseCode::Policy,
            CloseWhy::TooBig { .. } => CloseCode::Size,
            CloseWhy::Internal(_) => CloseCode::Error,
            CloseWhy::ShuttingDown => CloseCode::Away,
            CloseWhy::SlowConsumer { .. } => CloseCode::Policy,
        }
    }

    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            CloseWhy::Idle { .. } => "idle_timeout",
            CloseWhy::Protocol(_) => "protocol_error",
            CloseWhy::Binary => "binary_message",
            CloseWhy::InvalidUtf8 => "invalid_utf8",
            CloseWhy::RateLimit { .. } => "rate_limited",
            CloseWhy::TooBig { .. } => "message_too_big",
            CloseWhy::Internal(_) => "internal",
            CloseWhy::ShuttingDown => "shutting_down",
            CloseWhy::SlowConsumer { .. } => "slow_consumer",
        }
    }

    fn text(&self) -> String {
        match self {
            CloseWhy::Idle { secs } => format!("idle timeout: no frames for {secs} s"),
            CloseWhy::Protocol(what) => format!("protocol error: {what}"),
            CloseWhy::Binary => "binary messages are not supported; send JSON text".into(),
            CloseWhy::InvalidUtf8 => "text message is not valid UTF-8".into(),
            CloseWhy::RateLimit { refused } => {
                format!("rate limit: {refused} messages in a row sent while rate limited")
            }
            CloseWhy::TooBig { limit } => format!("message larger than {limit} bytes"),
            CloseWhy::Internal(what) => format!("internal error: {what}"),
            CloseWhy::ShuttingDown => "the server is shutting down".into(),
            CloseWhy::SlowConsumer { limit } => {
                format!("slow consumer: over {limit} bytes of output left unread")
            }
        }
    }

    /// The close frame to send, its reason cut to fit a control frame (on a char boundary).
    pub fn reason(&self) -> CloseReason {
        let mut text = self.text();
        if text.len() > MAX_REASON_BYTES {
            let mut end = MAX_REASON_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        CloseReason {
            code: self.code(),
            description: Some(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_rfc_6455_ones() {
        let cases = [
            (CloseWhy::Idle { secs: 5 }, 1000),
            (CloseWhy::Protocol("x".into()), 1002),
            (CloseWhy::Binary, 1003),
            (CloseWhy::InvalidUtf8, 1007),
            (CloseWhy::RateLimit { refused: 3 }, 1008),
            (CloseWhy::TooBig { limit: 10 }, 1009),
            (CloseWhy::Internal("x".into()), 1011),
            (CloseWhy::ShuttingDown, 1001),
            (CloseWhy::SlowConsumer { limit: 1 }, 1008),
        ];
        for (why, code) in cases {
            assert_eq!(u16::from(why.code()), code, "{why:?}");
            assert_eq!(why.reason().code, why.code());
        }
    }

    #[test]
    fn long_reasons_are_cut_on_a_char_boundary() {
        let why = CloseWhy::Protocol("é".repeat(200));
        let text = why.reason().description.unwrap();
        assert!(
            text.len() <= MAX_REASON_BYTES && text.len() > 100,
            "{}",
            text.len()
        );
        assert!(text.starts_with("protocol error: é"));
    }
}
