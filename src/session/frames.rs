//! RFC 6455 message reassembly, as a pure state machine: frames in (as actix-http's codec decodes
//! them), whole messages and control frames out. The codec already rejects most framing errors
//! itself (a continuation without a start, a new data frame inside a fragmented message, a
//! fragmented control frame); this machine checks them again so it is correct on its own, and adds
//! what the codec leaves to us: the whole-message size limit (the sum of fragments), UTF-8 of the
//! reassembled text, and refusing binary messages.

use actix_http::ws::Item;
use actix_web::web::Bytes;
use actix_web_actors::ws::{CloseReason, Frame};

use super::close::CloseWhy;

/// What one frame amounts to.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// A fragment was buffered; nothing to do yet.
    Pending,
    /// A complete text message.
    Message(String),
    /// Answer with a pong carrying the same payload.
    Ping(Bytes),
    Pong,
    /// The client closes (it may do so between fragments): answer and stop.
    Close(Option<CloseReason>),
    /// The connection must be failed with this close code.
    Fail(CloseWhy),
}

/// A text message arriving in fragments.
struct Partial {
    buf: Vec<u8>,
    /// `buf[..checked]` is known to be valid UTF-8; the rest is at most an incomplete character.
    checked: usize,
}

pub struct Reassembler {
    max_bytes: usize,
    partial: Option<Partial>,
}

impl Reassembler {
    /// `max_bytes`: the largest message, fragmented or not.
    pub fn new(max_bytes: usize) -> Self {
        Reassembler {
            max_bytes,
            partial: None,
        }
    }

    /// Bytes of a fragmented message buffered so far.
    pub fn buffered(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.buf.len())
    }

    pub fn push(&mut self, frame: Frame) -> Step {
        let step = self.step(frame);
        if matches!(step, Step::Fail(_)) {
            self.partial = None;
        }
        step
    }

    fn step(&mut self, frame: Frame) -> Step {
        let inside = self.partial.is_some();
        match frame {
            Frame::Ping(p) => Step::Ping(p),
            Frame::Pong(_) => Step::Pong,
            Frame::Close(reason) => Step::Close(reason),
            Frame::Text(_) | Frame::Binary(_) if inside => {
                protocol("a new data frame arrived inside a fragmented message")
            }
            Frame::Binary(_) => Step::Fail(CloseWhy::Binary),
            Frame::Text(data) => {
                if data.len() > self.max_bytes {
                    return Step::Fail(self.too_big());
                }
                match String::from_utf8(data.to_vec()) {
                    Ok(s) => Step::Message(s),
                    Err(_) => Step::Fail(CloseWhy::InvalidUtf8),
                }
            }
            Frame::Continuation(item) => match item {
                Item::FirstText(_) | Item::FirstBinary(_) if inside => {
                    protocol("a new fragmented message started inside another")
                }
                // Refused at once rather than buffered only to be refused at its end.
                Item::FirstBinary(_) => Step::Fail(CloseWhy::Binary),
                Item::FirstText(data) => {
                    self.partial = Some(Partial {
                        buf: Vec::new(),
                        checked: 0,
                    });
                    self.append(&data).unwrap_or(Step::Pending)
                }
                Item::Continue(_) | Item::Last(_) if !inside => {
                    protocol("a continuation frame arrived without a message to continue")
                }
                Item::Continue(data) => self.append(&data).unwrap_or(Step::Pending),
                Item::Last(data) => {
                    if let Some(fail) = self.append(&data) {
                        return fail;
                    }
                    let p = self.partial.take().expect("inside a message");
                    // Fails only when the message ends inside a character; all else is checked.
                    match String::from_utf8(p.buf) {
                        Ok(s) => Step::Message(s),
                        Err(_) => Step::Fail(CloseWhy::InvalidUtf8),
                    }
                }
            },
        }
    }

    /// Adds a fragment; `Some(Fail)` when the message grows too big or holds invalid UTF-8 so
    /// far (checked incrementally: each byte once, and the client learns early).
    fn append(&mut self, data: &[u8]) -> Option<Step> {
        let max = self.max_bytes;
        let p = self.partial.as_mut().expect("inside a message");
        if p.buf.len() + data.len() > max {
            return Some(Step::Fail(CloseWhy::TooBig { limit: max }));
        }
        p.buf.extend_from_slice(data);
        match std::str::from_utf8(&p.buf[p.checked..]) {
            Ok(_) => p.checked = p.buf.len(),
            // An incomplete character at the end may be finished by the next fragment.
            Err(e) if e.error_len().is_none() => p.checked += e.valid_up_to(),
            Err(_) => return Some(Step::Fail(CloseWhy::InvalidUtf8)),
        }
        None
    }

    fn too_big(&self) -> CloseWhy {
        CloseWhy::TooBig {
            limit: self.max_bytes,
        }
    }
}

fn protocol(what: &str) -> Step {
    Step::Fail(CloseWhy::Protocol(what.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &[u8]) -> Bytes {
        Bytes::copy_from_slice(s)
    }

    fn feed(r: &mut Reassembler, frames: Vec<Frame>) -> Vec<Step> {
        frames.into_iter().map(|f| r.push(f)).collect()
    }

    #[test]
    fn whole_and_fragmented_text() {
        let mut r = Reassembler::new(100);
        assert_eq!(r.push(Frame::Text(b(b"hi"))), Step::Message("hi".into()));
        let steps = feed(
            &mut r,
            vec![
                Frame::Continuation(Item::FirstText(b(b"ab"))),
                Frame::Continuation(Item::Continue(b(b""))),
                Frame::Continuation(Item::Continue(b(b"cd"))),
                Frame::Continuation(Item::Last(b(b"e"))),
            ],
        );
        assert_eq!(steps[..3], [Step::Pending, Step::Pending, Step::Pending]);
        assert_eq!(steps[3], Step::Message("abcde".into()));
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn control_frames_between_fragments() {
        let mut r = Reassembler::new(100);
        let steps = feed(
            &mut r,
            vec![
                Frame::Continuation(Item::FirstText(b(b"a"))),
                Frame::Ping(b(b"p1")),
                Frame::Pong(b(b"")),
                Frame::Continuation(Item::Last(b(b"b"))),
            ],
        );
        assert_eq!(
            steps,
            [
                Step::Pending,
                Step::Ping(b(b"p1")),
                Step::Pong,
                Step::Message("ab".into())
            ]
        );
        r.push(Frame::Continuation(Item::FirstText(b(b"a"))));
        assert_eq!(r.push(Frame::Close(None)), Step::Close(None));
    }

    #[test]
    fn a_character_split_across_fragments_is_fine() {
        let e = "é€😀".as_bytes();
        let mut r = Reassembler::new(100);
        r.push(Frame::Continuation(Item::FirstText(b(&e[..1]))));
        r.push(Frame::Continuation(Item::Continue(b(&e[1..4]))));
        assert_eq!(
            r.push(Frame::Continuation(Item::Last(b(&e[4..])))),
            Step::Message("é€😀".into())
        );
    }

    #[test]
    fn invalid_utf8_is_1007() {
        let mut r = Reassembler::new(100);
        assert_eq!(
            r.push(Frame::Text(b(b"a\xffb"))),
            Step::Fail(CloseWhy::InvalidUtf8)
        );
        // Found in the fragment that holds it, before the message ends.
        r.push(Frame::Continuation(Item::FirstText(b(b"ok"))));
        assert_eq!(
            r.push(Frame::Continuation(Item::Continue(b(b"\xc3\x28")))),
            Step::Fail(CloseWhy::InvalidUtf8)
        );
        // A message that ends inside a character.
        r.push(Frame::Continuation(Item::FirstText(b(b"ok"))));
        assert_eq!(
            r.push(Frame::Continuation(Item::Last(b(b"\xe2\x82")))),
            Step::Fail(CloseWhy::InvalidUtf8)
        );
    }

    #[test]
    fn size_limit_counts_the_whole_message() {
        let mut r = Reassembler::new(4);
        assert_eq!(
            r.push(Frame::Text(b(b"abcd"))),
            Step::Message("abcd".into())
        );
        assert_eq!(
            r.push(Frame::Text(b(b"abcde"))),
            Step::Fail(CloseWhy::TooBig { limit: 4 })
        );
        r.push(Frame::Continuation(Item::FirstText(b(b"ab"))));
        r.push(Frame::Continuation(Item::Continue(b(b"cd"))));
        assert_eq!(
            r.push(Frame::Continuation(Item::Last(b(b"e")))),
            Step::Fail(CloseWhy::TooBig { limit: 4 })
        );
    }

    #[test]
    fn binary_is_1003_and_framing_errors_are_1002() {
        let mut r = Reassembler::new(100);
        assert_eq!(r.push(Frame::Binary(b(b"x"))), Step::Fail(CloseWhy::Binary));
        assert_eq!(
            r.push(Frame::Continuation(Item::FirstBinary(b(b"x")))),
            Step::Fail(CloseWhy::Binary)
        );
        let code = |s: Step| match s {
            Step::Fail(w) => u16::from(w.code()),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(r.push(Frame::Continuation(Item::Continue(b(b"x"))))),
            1002
        );
        assert_eq!(code(r.push(Frame::Continuation(Item::Last(b(b"x"))))), 1002);
        for inner in [
            Frame::Text(b(b"x")),
            Frame::Binary(b(b"x")),
            Frame::Continuation(Item::FirstText(b(b"x"))),
            Frame::Continuation(Item::FirstBinary(b(b"x"))),
        ] {
            r.push(Frame::Continuation(Item::FirstText(b(b"a"))));
            assert_eq!(code(r.push(inner)), 1002);
            // A failure drops the partial message.
            assert_eq!(r.buffered(), 0);
        }
    }
}
