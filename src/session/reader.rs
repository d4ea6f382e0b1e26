//! Decodes the socket's bytes into WebSocket frames with actix-http's codec, in place of
//! actix-web-actors' own reader, for two things that one does not give:
//! - a text frame's bytes as they came: the UTF-8 check happens on the whole message
//!   (frames.rs), and its failure is a typed error (close 1007), not an I/O error;
//! - the size limit applied as soon as a frame's header declares its length: the codec alone
//!   buffers a frame whole before checking it, so a header announcing gigabytes would be
//!   buffered for as long as the client keeps sending.
//!
//! Buffered bytes per socket stay under the limit plus one frame header and one read chunk.

use std::pin::Pin;
use std::task::{Context, Poll};

use actix_codec::Decoder;
use actix_http::ws::{Codec, Frame, ProtocolError};
use actix_web::error::PayloadError;
use actix_web::web::{Bytes, BytesMut};
use futures_util::Stream;

/// Why reading stopped; after one error the stream ends.
#[derive(Debug)]
pub enum ReadError {
    /// A frame's header declares more than the limit (close 1009).
    TooBig { declared: u64 },
    /// The codec refused the bytes (close 1002).
    Protocol(ProtocolError),
    /// The connection failed underneath; no close frame can be delivered.
    Io(String),
}

pub struct FrameReader<S> {
    payload: S,
    buf: BytesMut,
    codec: Codec,
    max_frame: usize,
    done: bool,
}

impl<S> FrameReader<S> {
    pub fn new(payload: S, max_frame: usize) -> Self {
        FrameReader {
            payload,
            buf: BytesMut::new(),
            codec: Codec::new().max_size(max_frame),
            max_frame,
            done: false,
        }
    }

    fn fail(&mut self, e: ReadError) -> Poll<Option<Result<Frame, ReadError>>> {
        self.done = true;
        Poll::Ready(Some(Err(e)))
    }
}

/// The payload length a frame header declares, once enough of the header has arrived
/// (RFC 6455 §5.2: 7 bits, or 126 + 16 bits, or 127 + 64 bits).
pub fn declared_len(header: &[u8]) -> Option<u64> {
    let len7 = header.get(1)? & 0x7f;
    match len7 {
        126 => Some(u16::from_be_bytes(header.get(2..4)?.try_into().ok()?) as u64),
        127 => Some(u64::from_be_bytes(header.get(2..10)?.try_into().ok()?)),
        n => Some(n as u64),
    }
}

impl<S> Stream for FrameReader<S>
where
    S: Stream<Item = Result<Bytes, PayloadError>> + Unpin,
{
    type Item = Result<Frame, ReadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(declared) = declared_len(&this.buf) {
                if declared > this.max_frame as u64 {
                    return this.fail(ReadError::TooBig { declared });
                }
            }
            match this.codec.decode(&mut this.buf) {
                Ok(Some(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(None) => {}
                Err(ProtocolError::Overflow) => {
                    return this.fail(ReadError::TooBig { declared: u64::MAX })
                }
                Err(e) => return this.fail(ReadError::Protocol(e)),
            }
            match Pin::new(&mut this.payload).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => this.buf.extend_from_slice(&chunk),
                Poll::Ready(Some(Err(e))) => return this.fail(ReadError::Io(e.to_string())),
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_codec::Encoder;
    use actix_http::ws::{Message, OpCode, Parser};
    use futures_util::StreamExt;

    fn client_bytes(msgs: Vec<Message>) -> BytesMut {
        let mut codec = Codec::new().client_mode();
        let mut out = BytesMut::new();
        for m in msgs {
            codec.encode(m, &mut out).unwrap();
        }
        out
    }

    fn read_all(bytes: &[u8], chunk: usize, max: usize) -> Vec<Result<Frame, ReadError>> {
        let chunks: Vec<Result<Bytes, PayloadError>> = bytes
            .chunks(chunk.max(1))
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let reader = FrameReader::new(futures_util::stream::iter(chunks), max);
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(reader.collect())
    }

    #[test]
    fn header_lengths() {
        assert_eq!(declared_len(&[0x81]), None);
        assert_eq!(declared_len(&[0x81, 0x85]), Some(5));
        assert_eq!(declared_len(&[0x81, 0xfe, 0x01]), None);
        assert_eq!(declared_len(&[0x81, 0xfe, 0x01, 0x00]), Some(256));
        let mut h = vec![0x81, 0xff];
        h.extend_from_slice(&(1u64 << 40).to_be_bytes());
        assert_eq!(declared_len(&h), Some(1 << 40));
    }

    #[test]
    fn frames_arrive_whatever_the_chunking() {
        let bytes = client_bytes(vec![
            Message::Text("hello".into()),
            Message::Ping(Bytes::from_static(b"p")),
            Message::Close(None),
        ]);
        for chunk in [1, 3, 1000] {
            let frames: Vec<Frame> = read_all(&bytes, chunk, 100)
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            assert_eq!(
                frames,
                [
                    Frame::Text(Bytes::from_static(b"hello")),
                    Frame::Ping(Bytes::from_static(b"p")),
                    Frame::Close(None)
                ]
            );
        }
    }

    #[test]
    fn an_oversized_header_fails_before_its_payload_arrives() {
        // Only the header of a 1 GiB frame: refused without waiting for (or buffering) the rest.
        let mut header = BytesMut::new();
        header.extend_from_slice(&[0x81, 0xff]);
        header.extend_from_slice(&(1u64 << 30).to_be_bytes());
        header.extend_from_slice(&[1, 2, 3, 4]);
        let out = read_all(&header, 4, 1000);
        assert!(matches!(out[..], [Err(ReadError::TooBig { declared })] if declared == 1 << 30));
    }

    #[test]
    fn invalid_utf8_text_is_passed_on_and_framing_errors_end_the_stream() {
        let mut raw = BytesMut::new();
        Parser::write_message(&mut raw, &b"\xff"[..], OpCode::Text, true, true);
        Parser::write_message(&mut raw, &b"x"[..], OpCode::Continue, true, true);
        Parser::write_message(&mut raw, &b"y"[..], OpCode::Text, true, true);
        let out = read_all(&raw, 7, 100);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(matches!(&out[0], Ok(Frame::Text(t)) if &t[..] == b"\xff"));
        assert!(matches!(
            out[1],
            Err(ReadError::Protocol(ProtocolError::ContinuationNotStarted))
        ));
        // Unmasked client frames are refused too.
        let mut raw = BytesMut::new();
        Parser::write_message(&mut raw, &b"y"[..], OpCode::Text, true, false);
        assert!(matches!(
            read_all(&raw, 100, 100)[..],
            [Err(ReadError::Protocol(ProtocolError::UnmaskedFrame))]
        ));
    }
}
