//! Fuzzing of the WebSocket edge without a socket: property tests of the client-message parser
//! (`protocol::parse_client_frame`) and of request validation (`SamplingParams::from_raw`), the
//! malformed-message corpus (tests/corpus/ws/) replayed through them, and the frame reassembly:
//! random messages split into random fragment sequences with control frames between them, fed
//! both as frames and as masked bytes in random read chunks, must come out whole or with the
//! right close code.
//! (Over 600 lines: the parser, validation and reassembly properties share these generators.)
mod common;

use actix_http::ws::{Frame, Item, OpCode, Parser};
use actix_web::web::{Bytes, BytesMut};
use futures_util::StreamExt;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Value};

use brook::protocol::{parse_client_frame, ClientFrame, MAX_ID_LEN};
use brook::sampling::params::{RawSamplingParams, SamplingParams};
use brook::session::frames::{Reassembler, Step};
use brook::session::reader::{FrameReader, ReadError};
use brook::validation::PromptInput;

const VOCAB: usize = 4096;

// ---------------------------------------------------------------- parser

const KEYS: &[&str] = &[
    "type",
    "id",
    "prompt",
    "messages",
    "params",
    "role",
    "content",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(KEYS).prop_map(String::from),
        1 => any::<String>(),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|x| json!(x)),
        select(&["generate", "cancel", "user", "", "a"][..]).prop_map(|s| json!(s)),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Objects shaped like client frames: a likely `type`, then random fields.
fn frame_like() -> impl Strategy<Value = Value> {
    (
        select(&["generate", "cancel", "other"][..]),
        btree_map(key(), json_value(), 0..6),
    )
        .prop_map(|(t, fields)| {
            let mut m: Map<String, Value> = fields.into_iter().collect();
            m.insert("type".into(), json!(t));
            Value::Object(m)
        })
}

fn check_parse(text: &str) {
    match parse_client_frame(text) {
        Ok(ClientFrame::Generate(g)) => {
            assert!(!g.id.is_empty() && g.id.chars().count() <= MAX_ID_LEN);
        }
        Ok(ClientFrame::Cancel { id }) => {
            assert!(!id.is_empty() && id.chars().count() <= MAX_ID_LEN)
        }
        Err(e) => {
            let code = e.error.code();
            assert!(
                code == "invalid_json" || code == "invalid_request",
                "{code}"
            );
            assert!(!e.error.to_string().is_empty());
            if let Some(id) = &e.id {
                // An error names a request only by the id the frame really carried.
                let v: Value = serde_json::from_str(text).expect("an id implies valid JSON");
                assert_eq!(v["id"].as_str(), Some(id.as_str()));
            }
        }
    }
}

/// A random edit of a valid frame: cut, duplicate or replace a span of characters.
fn mutate(s: &str, op: u8, at: usize, len: usize, with: char) -> String {
    let mut c: Vec<char> = s.chars().collect();
    let at = at % (c.len() + 1);
    let end = (at + len).min(c.len());
    match op % 4 {
        0 => {
            c.drain(at..end);
        }
        1 => {
            let dup: Vec<char> = c[at..end].to_vec();
            c.splice(at..at, dup);
        }
        2 => c.splice(at..end, [with]).for_each(drop),
        _ => c.truncate(at),
    }
    c.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parser_never_panics_on_any_text(s in any::<String>()) {
        check_parse(&s);
    }

    #[test]
    fn parser_never_panics_on_any_json(v in json_value()) {
        check_parse(&v.to_string());
    }

    #[test]
    fn parser_errors_are_typed_on_frame_like_objects(v in frame_like()) {
        check_parse(&v.to_string());
    }

    #[test]
    fn parser_survives_mutated_valid_frames(
        op in any::<u8>(), at in any::<usize>(), len in 0usize..12, with in any::<char>()
    ) {
        let valid = r#"{"type":"generate","id":"r1","messages":[{"role":"user","content":"hé"}],"params":{"max_tokens":5,"temperature":0.5,"stop":["\n"]}}"#;
        check_parse(&mutate(valid, op, at, len, with));
    }

    /// A valid generate frame with random content parses to exactly that content.
    #[test]
    fn valid_generate_frames_round_trip(
        id in "\\PC{1,40}",
        prompt in "\\PC{1,200}",
        max_tokens in 1i64..=(1 << 20),
        temperature in 0.0f64..=100.0,
        seed in any::<u64>(),
        stop in vec("\\PC{1,8}", 0..4),
    ) {
        let text = json!({"type":"generate","id":id,"prompt":prompt,
            "params":{"max_tokens":max_tokens,"temperature":temperature,"seed":seed,"stop":stop}})
            .to_string();
        let ClientFrame::Generate(g) = parse_client_frame(&text).unwrap() else {
            panic!("not a generate");
        };
        prop_assert_eq!(&g.id, &id);
        prop_assert!(matches!(&g.input, PromptInput::Text(p) if *p == prompt));
        prop_assert_eq!(g.params.max_tokens, Some(max_tokens));
        prop_assert_eq!(g.params.seed, Some(seed));
        prop_assert_eq!(g.params.stop.as_ref(), Some(&stop));
        let p = SamplingParams::from_raw(g.params, &SamplingParams::default(), VOCAB).unwrap();
        prop_assert_eq!(p.max_tokens as i64, max_tokens);
        prop_assert_eq!(p.stop, stop);
    }
}

// ---------------------------------------------------------------- request validation

fn opt<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![1 => Just(None), 3 => s.prop_map(Some)]
}

/// Values around and outside each documented range (docs/PROTOCOL.md).
fn edge_f64(lo: f64, hi: f64) -> impl Strategy<Value = f64> {
    prop_oneof![
        select(vec![
            lo,
            hi,
            lo - 1e-9,
            hi + 1e-9,
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            -f64::INFINITY,
            f64::MIN_POSITIVE
        ]),
        (lo - 1.0)..(hi + 1.0),
    ]
}

fn raw_params() -> impl Strategy<Value = RawSamplingParams> {
    let base = (
        opt(prop_oneof![
            select(vec![
                0i64,
                1,
                1 << 20,
                (1 << 20) + 1,
                -1,
                i64::MIN,
                i64::MAX
            ]),
            any::<i64>()
        ]),
        opt(edge_f64(0.0, 100.0)),
        opt(edge_f64(0.0, 1.0)),
        opt(prop_oneof![
            select(vec![0i64, 1, -1, i64::MIN]),
            any::<i64>()
        ]),
        opt(edge_f64(0.0, 1.0)),
        opt(any::<u64>()),
        opt(vec(prop_oneof!["\\PC{0,3}", "x{250,260}"], 0..18)),
        opt(prop_oneof![
            vec(prop_oneof![0u32..(VOCAB as u32 + 2), any::<u32>()], 0..4),
            vec(0u32..VOCAB as u32, 63..66),
        ]),
        opt(any::<bool>()),
    );
    // The penalties, logit bias, min_tokens and logprobs.
    let more = (
        opt(edge_f64(-2.0, 2.0)),
        opt(edge_f64(-2.0, 2.0)),
        opt(edge_f64(0.0, 100.0)),
        opt(btree_map(
            prop_oneof!["[0-9]{1,3}", "0[0-9]", " ?[a-z]", "[0-9]{10}"],
            edge_f64(-100.0, 100.0),
            0..4,
        )),
        opt(prop_oneof![
            select(vec![0i64, 1, 16, 256, 257, -1]),
            any::<i64>()
        ]),
        opt(prop_oneof![select(vec![0i64, 5, 20, 21, -1]), any::<i64>()]),
    );
    (base, more).prop_map(
        |(
            (max_tokens, temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos),
            (
                presence_penalty,
                frequency_penalty,
                repetition_penalty,
                logit_bias,
                min_tokens,
                logprobs,
            ),
        )| {
            RawSamplingParams {
                max_tokens,
                temperature,
                top_p,
                top_k,
                min_p,
                seed,
                stop,
                stop_token_ids,
                ignore_eos,
                speculative: None,
                presence_penalty,
                frequency_penalty,
                repetition_penalty,
                logit_bias,
                min_tokens,
                logprobs,
            }
        },
    )
}

/// The documented rules, restated independently: which field (if any) must be refused.
fn first_bad_field(r: &RawSamplingParams) -> Option<&'static str> {
    let in_f =
        |v: Option<f64>, ok: &dyn Fn(f64) -> bool| v.is_some_and(|x| !(x.is_finite() && ok(x)));
    if r.max_tokens.is_some_and(|n| !(1..=1 << 20).contains(&n)) {
        return Some("max_tokens");
    }
    if in_f(r.temperature, &|t| (0.0..=100.0).contains(&t)) {
        return Some("temperature");
    }
    if in_f(r.top_p, &|p| p as f32 > 0.0 && p <= 1.0) {
        return Some("top_p");
    }
    if r.top_k.is_some_and(|k| k < 0) {
        return Some("top_k");
    }
    if in_f(r.min_p, &|p| (0.0..=1.0).contains(&p)) {
        return Some("min_p");
    }
    if in_f(r.presence_penalty, &|p| (-2.0..=2.0).contains(&p)) {
        return Some("presence_penalty");
    }
    if in_f(r.frequency_penalty, &|p| (-2.0..=2.0).contains(&p)) {
        return Some("frequency_penalty");
    }
    if in_f(r.repetition_penalty, &|p| p as f32 > 0.0 && p <= 100.0) {
        return Some("repetition_penalty");
    }
    if let Some(stop) = &r.stop {
        if stop.len() > 16 || stop.iter().any(|s| s.is_empty() || s.len() > 256) {
            return Some("stop");
        }
    }
    if r.stop_token_ids
        .as_ref()
        .is_some_and(|ids| ids.len() > 64 || ids.iter().any(|&t| t as usize >= VOCAB))
    {
        return Some("stop_token_ids");
    }
    if let Some(bias) = &r.logit_bias {
        let ids: Vec<Option<u32>> = bias
            .keys()
            .map(|k| {
                k.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&t| (t as usize) < VOCAB)
            })
            .collect();
        let mut distinct: Vec<u32> = ids.iter().flatten().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        if ids.iter().any(Option::is_none)
            || bias
                .values()
                .any(|v| !(v.is_finite() && (-100.0..=100.0).contains(v)))
            || distinct.len() < ids.len()
        {
            return Some("logit_bias");
        }
    }
    let max_tokens = r.max_tokens.unwrap_or(256);
    if r.min_tokens.is_some_and(|n| !(0..=max_tokens).contains(&n)) {
        return Some("min_tokens");
    }
    if r.logprobs.is_some_and(|n| !(0..=20).contains(&n)) {
        return Some("logprobs");
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn validation_accepts_exactly_the_documented_ranges(raw in raw_params()) {
        let bad = first_bad_field(&raw);
        match (SamplingParams::from_raw(raw.clone(), &SamplingParams::default(), VOCAB), bad) {
            (Ok(p), None) => {
                prop_assert!(p.max_tokens >= 1 && p.max_tokens <= 1 << 20);
                prop_assert!((0.0..=100.0).contains(&p.temperature));
                prop_assert!(p.top_p > 0.0 && p.top_p <= 1.0);
                prop_assert!((0.0..=1.0).contains(&p.min_p));
                prop_assert_eq!(p.seed, raw.seed);
                prop_assert_eq!(p.ignore_eos, raw.ignore_eos.unwrap_or(false));
            }
            (Err(e), Some(field)) => {
                prop_assert_eq!(e.code(), "invalid_request");
                let msg = e.to_string();
                prop_assert!(msg.contains(&format!("params.{field}")), "{} should name {}", msg, field);
            }
            (got, want) => prop_assert!(false, "{:?} for {:?}: expected refusal of {:?}", got, raw, want),
        }
    }
}

/// The corpus through the parser and validation: the parser refuses each message with its
/// file's code, or, for codes only the engine sees (parameter ranges, unknown ids), lets it
/// through and validation or the session refuses it (tests/ws_edge.rs checks that end over a
/// socket).
#[test]
fn corpus_replays_through_the_parser() {
    let corpus = common::corpus_files();
    assert!(corpus.len() >= 20);
    for (name, code, text) in corpus {
        match parse_client_frame(&text) {
            Err(e) => assert_eq!(e.error.code(), code, "{name}: {}", e.error),
            Ok(ClientFrame::Generate(g)) => {
                assert_eq!(code, "invalid_request", "{name} parsed");
                let params_bad =
                    SamplingParams::from_raw(g.params.clone(), &SamplingParams::default(), VOCAB)
                        .is_err();
                let prompt_empty = matches!(&g.input, PromptInput::Text(p) if p.is_empty());
                assert!(params_bad || prompt_empty, "{name}: nothing refuses it");
            }
            Ok(ClientFrame::Cancel { .. }) => assert_eq!(code, "unknown_id", "{name}"),
        }
    }
}

// ---------------------------------------------------------------- frame reassembly

/// What a connection's frames amounted to: pong payloads sent back, messages delivered, and
/// the close code it ended with (if any).
#[derive(Debug, PartialEq, Default)]
struct Outcome {
    pongs: Vec<Vec<u8>>,
    messages: Vec<String>,
    close: Option<u16>,
}

impl Outcome {
    fn apply(&mut self, step: Step) -> bool {
        match step {
            Step::Pending | Step::Pong | Step::Close(_) => {}
            Step::Ping(p) => self.pongs.push(p.to_vec()),
            Step::Message(m) => self.messages.push(m),
            Step::Fail(why) => {
                self.close = Some(u16::from(why.code()));
                return false;
            }
        }
        true
    }
}

#[derive(Debug, Clone)]
enum Wire {
    /// A data frame: opcode, fin, payload.
    Data(OpCode, bool, Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

impl Wire {
    /// The frame as actix-http's codec reports it.
    fn frame(&self) -> Frame {
        let b = |v: &Vec<u8>| Bytes::copy_from_slice(v);
        match self {
            Wire::Ping(p) => Frame::Ping(b(p)),
            Wire::Pong(p) => Frame::Pong(b(p)),
            Wire::Data(op, fin, p) => match (op, fin) {
                (OpCode::Text, true) => Frame::Text(b(p)),
                (OpCode::Binary, true) => Frame::Binary(b(p)),
                (OpCode::Text, false) => Frame::Continuation(Item::FirstText(b(p))),
                (OpCode::Binary, false) => Frame::Continuation(Item::FirstBinary(b(p))),
                (_, false) => Frame::Continuation(Item::Continue(b(p))),
                (_, true) => Frame::Continuation(Item::Last(b(p))),
            },
        }
    }

    fn bytes(&self, out: &mut BytesMut) {
        let (op, fin, p) = match self {
            Wire::Data(op, fin, p) => (*op, *fin, p),
            Wire::Ping(p) => (OpCode::Ping, true, p),
            Wire::Pong(p) => (OpCode::Pong, true, p),
        };
        Parser::write_message(out, &p[..], op, fin, true);
    }
}

fn run_frames(wire: &[Wire], max: usize) -> Outcome {
    let mut r = Reassembler::new(max);
    let mut out = Outcome::default();
    for w in wire {
        if !out.apply(r.push(w.frame())) {
            break;
        }
    }
    out
}

/// The same through the byte-level reader, the bytes arriving in chunks of the given sizes.
fn run_bytes(wire: &[Wire], max: usize, chunks: &[usize]) -> Outcome {
    let mut all = BytesMut::new();
    for w in wire {
        w.bytes(&mut all);
    }
    let mut pieces = Vec::new();
    let mut rest = all.freeze();
    let mut i = 0;
    while !rest.is_empty() {
        let n = chunks[i % chunks.len()].clamp(1, rest.len());
        pieces.push(Ok::<_, actix_web::error::PayloadError>(rest.split_to(n)));
        i += 1;
    }
    let reader = FrameReader::new(futures_util::stream::iter(pieces), max);
    let items: Vec<Result<Frame, ReadError>> = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(reader.collect());
    let mut r = Reassembler::new(max);
    let mut out = Outcome::default();
    for item in items {
        let step = match item {
            Ok(f) => r.push(f),
            Err(ReadError::TooBig { .. }) => {
                out.close = Some(1009);
                break;
            }
            Err(ReadError::Protocol(_)) => {
                out.close = Some(1002);
                break;
            }
            Err(ReadError::Io(e)) => panic!("{e}"),
        };
        if !out.apply(step) {
            break;
        }
    }
    out
}

/// A message cut at `cuts` into data frames, with control frames inserted after the given
/// fragment indices.
fn fragment(msg: &[u8], cuts: &[usize], controls: &[(usize, Wire)]) -> Vec<Wire> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (msg.len() + 1)).collect();
    at.sort();
    let mut bounds = vec![0];
    bounds.extend(at);
    bounds.push(msg.len());
    let pieces: Vec<&[u8]> = bounds.windows(2).map(|w| &msg[w[0]..w[1]]).collect();
    let n = pieces.len();
    let mut wire = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        let op = if i == 0 {
            OpCode::Text
        } else {
            OpCode::Continue
        };
        wire.push(Wire::Data(op, i == n - 1, p.to_vec()));
        for (after, c) in controls {
            if after % n == i && i < n - 1 {
                wire.push(c.clone());
            }
        }
    }
    wire
}

/// The oracle, from the rules rather than the implementation: walking the data frames, the
/// first whose running total exceeds `max` fails 1009; the first after which the bytes so far
/// hold a UTF-8 error no later byte can repair fails 1007; the end must be complete UTF-8.
/// Control frames before the failure are answered.
fn expected(wire: &[Wire], max: usize) -> Outcome {
    let mut out = Outcome::default();
    let mut so_far: Vec<u8> = Vec::new();
    for w in wire {
        match w {
            Wire::Ping(p) => out.pongs.push(p.clone()),
            Wire::Pong(_) => {}
            Wire::Data(_, fin, p) => {
                so_far.extend_from_slice(p);
                if so_far.len() > max {
                    out.close = Some(1009);
                    return out;
                }
                match std::str::from_utf8(&so_far) {
                    Ok(s) if *fin => out.messages.push(s.to_string()),
                    Ok(_) => {}
                    Err(e) if e.error_len().is_some() || *fin => {
                        out.close = Some(1007);
                        return out;
                    }
                    Err(_) => {}
                }
            }
        }
    }
    out
}

fn control() -> impl Strategy<Value = Wire> {
    prop_oneof![
        vec(any::<u8>(), 0..16).prop_map(Wire::Ping),
        vec(any::<u8>(), 0..16).prop_map(Wire::Pong),
    ]
}

fn message() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => any::<String>().prop_map(String::into_bytes),
        1 => "[a-zé€😀]{0,300}".prop_map(String::into_bytes),
        1 => vec(any::<u8>(), 0..300),
        // Valid text with one bad byte somewhere.
        1 => (any::<String>(), any::<usize>(), 0x80u8..=0xff).prop_map(|(s, at, bad)| {
            let mut b = s.into_bytes();
            let at = at % (b.len() + 1);
            b.insert(at, bad);
            b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn fragments_reassemble_to_the_message_or_the_right_close_code(
        msg in message(),
        cuts in vec(any::<usize>(), 0..8),
        controls in vec((any::<usize>(), control()), 0..6),
        any_max in 16usize..400,
        at_edge in any::<bool>(),
        delta in 0usize..4,
        chunks in vec(1usize..64, 1..6),
    ) {
        // Half the cases put the limit within a byte or two of the message's size.
        let max = if at_edge { (msg.len() + delta).saturating_sub(2).max(16) } else { any_max };
        let wire = fragment(&msg, &cuts, &controls);
        let want = expected(&wire, max);
        prop_assert_eq!(&run_frames(&wire, max), &want);
        prop_assert_eq!(&run_bytes(&wire, max, &chunks), &want);
        if want.close.is_none() {
            let whole = want.messages.concat();
            prop_assert_eq!(whole.as_bytes(), &msg[..]);
        }
    }

    /// A framing violation anywhere in a valid sequence fails with 1002 right there.
    #[test]
    fn a_misplaced_data_frame_is_a_protocol_error(
        msg in "[a-z]{10,60}",
        cuts in vec(any::<usize>(), 1..5),
        bad in 0u8..5,
        at in any::<usize>(),
        chunks in vec(1usize..64, 1..6),
    ) {
        let mut wire = fragment(msg.as_bytes(), &cuts, &[]);
        let n = wire.len();
        let (pos, frame) = match bad {
            // Before the first frame, or after the last: nothing to continue.
            0 => (0, Wire::Data(OpCode::Continue, false, b"x".to_vec())),
            1 => (n, Wire::Data(OpCode::Continue, true, b"x".to_vec())),
            // Inside the message (after its first frame, before its last).
            2 => (1 + at % (n - 1).max(1), Wire::Data(OpCode::Text, true, b"x".to_vec())),
            3 => (1 + at % (n - 1).max(1), Wire::Data(OpCode::Binary, false, b"x".to_vec())),
            _ => (1 + at % (n - 1).max(1), Wire::Data(OpCode::Text, false, b"x".to_vec())),
        };
        let inside = (2..=4).contains(&bad);
        prop_assume!(!inside || n >= 2);
        wire.insert(pos, frame);
        let got = run_frames(&wire, 1000);
        prop_assert_eq!(got.close, Some(1002), "{:?}", wire);
        // A message completed before the bad frame is still delivered; none after it.
        prop_assert_eq!(got.messages.len(), usize::from(bad == 1));
        prop_assert_eq!(run_bytes(&wire, 1000, &chunks), got);
    }
}
