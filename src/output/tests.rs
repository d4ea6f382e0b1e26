//! The output processor on its own: real bounded channels (read with `try_recv`), the fixture
//! tokenizer, explicit instants. Each test starts from `Harness::default()`-like defaults and
//! changes one thing.
//!
//! (Over 600 lines: the harness is shared by every output-processor test; n > 1 and backlog
//! cases joined it.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::text::TextOutput;
use super::{delta_bytes, Backlog, OutputProcessor, Processed};
use crate::error::EngineError;
use crate::metrics::Metrics;
use crate::request::{FinishReason, RequestId, StreamEvent, Timing, TokenLogprobs, Usage};
use crate::scheduler::RequestUpdate;
use crate::tokenizer::Tokenizer;
use crate::tokenizer_fixture::TokFixture;

const ID: RequestId = RequestId(7);

struct Harness {
    out: OutputProcessor,
    metrics: Arc<Metrics>,
    tok: Arc<Tokenizer>,
    rx: mpsc::Receiver<StreamEvent>,
    t0: Instant,
    prompt_tokens: usize,
}

impl Harness {
    /// One request (prompt "Hello", `stop` strings) on a channel of `capacity`; with
    /// `tokenizer` false the processor counts tokens only.
    fn new(stop: &[&str], capacity: usize, tokenizer: bool) -> Self {
        let tok = Arc::new(TokFixture::default().build());
        let metrics = Arc::new(Metrics::new());
        let mut out = OutputProcessor::new(tokenizer.then(|| tok.clone()), metrics.clone());
        let (tx, rx) = mpsc::channel(capacity);
        let prompt = tok.encode("Hello", true).unwrap();
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let t0 = Instant::now();
        let text = tokenizer.then(|| TextOutput::new(&tok, &prompt, &stop, 0));
        out.add_request(ID, 1, prompt.len(), text, tx, None, t0);
        Harness {
            out,
            metrics,
            tok,
            rx,
            t0,
            prompt_tokens: prompt.len(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// One step's update for the request, at `ms` after arrival.
    fn step(&mut self, ids: &[u32], finished: Option<FinishReason>, ms: u64) -> Processed {
        self.step_with_logprobs(ids, Vec::new(), finished, ms)
    }

    fn step_with_logprobs(
        &mut self,
        ids: &[u32],
        logprobs: Vec<TokenLogprobs>,
        finished: Option<FinishReason>,
        ms: u64,
    ) -> Processed {
        let u = RequestUpdate {
            id: ID,
            new_token_ids: ids.to_vec(),
            logprobs,
            finished,
            num_computed_tokens: 0,
            num_output_tokens: 0,
        };
        let now = self.at(ms);
        self.out.process(&[u], now, false)
    }

    fn ids(&self, text: &str) -> Vec<u32> {
        self.tok.encode(text, false).unwrap()
    }

    fn drain(&mut self) -> Vec<StreamEvent> {
        let mut evs = Vec::new();
        while let Ok(ev) = self.rx.try_recv() {
            evs.push(ev);
        }
        evs
    }
}

fn text_of(evs: &[StreamEvent]) -> String {
    evs.iter()
        .filter_map(|e| match e {
            StreamEvent::Delta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn tokens_of(evs: &[StreamEvent]) -> usize {
    evs.iter()
        .map(|e| match e {
            StreamEvent::Delta { tokens, .. } => *tokens,
            _ => 0,
        })
        .sum()
}

fn done_of(evs: &[StreamEvent]) -> (FinishReason, Usage, Timing) {
    match evs.last() {
        Some(StreamEvent::Done {
            finish_reason,
            usage,
            timing,
            ..
        }) => (*finish_reason, *usage, *timing),
        other => panic!("expected done last, got {other:?}"),
    }
}

#[test]
fn one_delta_per_step_and_the_text_is_the_decode() {
    let mut h = Harness::new(&[], 64, true);
    let ids = h.ids("the quick brown fox");
    assert!(ids.len() >= 4);
    let prompt_tokens = h.prompt_tokens;
    assert_eq!(h.drain(), [StreamEvent::Started { prompt_tokens }]);
    let mut deltas = 0;
    for (i, &id) in ids.iter().enumerate() {
        let last = i + 1 == ids.len();
        let done = h.step(
            &[id],
            last.then_some(FinishReason::Length),
            10 * i as u64 + 10,
        );
        assert!(done.stopped.is_empty() && done.aborted.is_empty() && done.blocked.is_empty());
        let evs = h.drain();
        let step_deltas = evs
            .iter()
            .filter(|e| matches!(e, StreamEvent::Delta { .. }))
            .count();
        assert!(step_deltas <= 1, "{evs:?}");
        deltas += step_deltas;
        if last {
            assert_eq!(done_of(&evs).0, FinishReason::Length);
        }
    }
    assert!(deltas > 1);
    assert!(!h.out.contains(ID));
}

#[test]
fn stop_string_across_steps_is_cut_and_reported_to_the_core() {
    let mut h = Harness::new(&["brown fox"], 64, true);
    h.drain();
    let ids = h.ids("the quick brown fox jumps");
    let mut sent = Vec::new();
    let mut stopped_at = None;
    for (i, &id) in ids.iter().enumerate() {
        let done = h.step(&[id], None, i as u64);
        sent.extend(h.drain());
        if !done.stopped.is_empty() {
            assert_eq!(done.stopped, [ID]);
            stopped_at = Some(i);
            break;
        }
    }
    // The stop string took several steps to complete, and none of it was sent.
    assert!(stopped_at.unwrap() >= 2);
    assert_eq!(text_of(&sent), "the quick ");
    assert_eq!(done_of(&sent).0, FinishReason::Stop);
    // Gone: a later step's tokens for it (the step in flight) are dropped without events.
    let done = h.step(&ids[..1], None, 99);
    assert!(done.stopped.is_empty());
    assert!(h.drain().is_empty());
}

/// A speculative step's tokens past the one that completes a stop string are not output: the
/// usage, the deltas' counts and their log-probabilities stop at that token.
#[test]
fn tokens_after_a_stop_string_in_one_step_are_not_counted() {
    let mut h = Harness::new(&["brown"], 64, true);
    h.drain();
    let ids = h.ids("the quick brown fox jumps over");
    let used = (1..=ids.len())
        .find(|&k| h.tok.decode(&ids[..k], true).contains("brown"))
        .unwrap();
    assert!(used < ids.len());
    let logprobs = (0..ids.len())
        .map(|i| TokenLogprobs {
            token: ids[i],
            logprob: -(i as f32),
            top: Vec::new(),
        })
        .collect();
    let done = h.step_with_logprobs(&ids, logprobs, None, 1);
    assert_eq!(done.stopped, [ID]);
    let evs = h.drain();
    assert_eq!(text_of(&evs), "the quick ");
    assert_eq!(tokens_of(&evs), used);
    let (reason, usage, _) = done_of(&evs);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(usage.completion_tokens, used);
    let sent_logprobs: usize = evs
        .iter()
        .map(|e| match e {
            StreamEvent::Delta { logprobs, .. } => logprobs.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(sent_logprobs, used);
}

#[test]
fn held_text_is_released_when_the_core_finishes_the_request() {
    let mut h = Harness::new(&["fox!"], 64, true);
    h.drain();
    let ids = h.ids("a fox");
    let (last, head) = ids.split_last().unwrap();
    h.step(head, None, 1);
    // "fox" could still become "fox!": held back until the request ends.
    let done = h.step(&[*last], Some(FinishReason::Length), 2);
    assert!(done.stopped.is_empty(), "the core finished it itself");
    let evs = h.drain();
    assert_eq!(text_of(&evs), "a fox");
    assert_eq!(done_of(&evs).0, FinishReason::Length);
}

#[test]
fn eos_in_the_last_step_counts_but_shows_no_text() {
    let mut h = Harness::new(&[], 64, true);
    h.drain();
    let mut ids = h.ids("Hi");
    ids.push(h.tok.eos_token_ids()[0]);
    h.step(&ids, Some(FinishReason::Stop), 5);
    let evs = h.drain();
    assert_eq!(text_of(&evs), "Hi");
    assert_eq!(tokens_of(&evs), ids.len());
    assert_eq!(done_of(&evs).1.completion_tokens, ids.len());
}

/// Tokens without text at the end (eos in a step of its own, special tokens under
/// `ignore_eos`) come in a last delta with empty text: the deltas' counts add up to the usage.
#[test]
fn tokens_without_text_at_the_end_still_come_in_a_delta() {
    let mut h = Harness::new(&[], 64, true);
    h.drain();
    let ids = h.ids("Hi");
    h.step(&ids, None, 5);
    let eos = h.tok.eos_token_ids()[0];
    h.step(&[eos], None, 6);
    h.step(&[eos], Some(FinishReason::Length), 7);
    let evs = h.drain();
    assert_eq!(text_of(&evs), "Hi");
    assert_eq!(tokens_of(&evs), ids.len() + 2);
    assert_eq!(done_of(&evs).1.completion_tokens, ids.len() + 2);
    assert!(matches!(
        &evs[evs.len() - 2],
        StreamEvent::Delta { text, tokens: 2, .. } if text.is_empty()
    ));
}

#[test]
fn usage_timing_and_metrics() {
    let mut h = Harness::new(&[], 64, true);
    h.drain();
    h.out.scheduled(&[ID], h.at(10));
    let ids = h.ids("one two three");
    let n = ids.len();
    h.step(&ids[..1], None, 30);
    h.step(&ids[1..n - 1], None, 50);
    h.step(&ids[n - 1..], Some(FinishReason::Length), 100);
    let (reason, usage, timing) = done_of(&h.drain());
    assert_eq!(reason, FinishReason::Length);
    assert_eq!(
        usage,
        Usage {
            prompt_tokens: h.prompt_tokens,
            completion_tokens: n
        }
    );
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    assert!(close(timing.queue_ms, 10.0), "{timing:?}");
    assert!(close(timing.ttft_ms.unwrap(), 30.0), "{timing:?}");
    assert!(close(timing.total_ms, 100.0), "{timing:?}");
    let m = &h.metrics;
    assert_eq!(m.prompt_tokens.get(), h.prompt_tokens as u64);
    assert_eq!(m.generation_tokens.get(), n as u64);
    assert_eq!(m.ttft.get_sample_count(), 1);
    assert!(close(m.ttft.get_sample_sum(), 0.030));
    // Every token after the first has an inter-token latency: (50-30)/(n-2) each, then 50.
    assert_eq!(m.itl.get_sample_count(), n as u64 - 1);
    assert!(
        close(m.itl.get_sample_sum(), 0.070),
        "{}",
        m.itl.get_sample_sum()
    );
    assert!(close(m.queue_time.get_sample_sum(), 0.010));
    assert!(close(m.e2e_latency.get_sample_sum(), 0.100));
    let finished = m.requests_finished.with_label_values(&["length"]).get();
    assert_eq!(finished, 1);
}

#[test]
fn emergency_mode_skips_inter_token_latency_only() {
    let mut h = Harness::new(&[], 64, true);
    let ids = h.ids("one two");
    let u = |ids: &[u32]| RequestUpdate {
        id: ID,
        new_token_ids: ids.to_vec(),
        logprobs: Vec::new(),
        finished: None,
        num_computed_tokens: 0,
        num_output_tokens: 0,
    };
    h.out.process(&[u(&ids[..1])], h.at(1), true);
    h.out.process(&[u(&ids[1..])], h.at(2), true);
    assert_eq!(h.metrics.ttft.get_sample_count(), 1);
    assert_eq!(h.metrics.itl.get_sample_count(), 0);
    assert_eq!(h.metrics.generation_tokens.get(), ids.len() as u64);
}

#[test]
fn slow_reader_gets_merged_deltas_and_loses_nothing() {
    // Room for `started` and one delta; the reader reads nothing until the end.
    let mut h = Harness::new(&[], 2, true);
    let text = "the quick brown fox jumps over the lazy dog";
    let ids = h.ids(text);
    for (i, &id) in ids.iter().enumerate() {
        let done = h.step(&[id], None, i as u64);
        assert!(done.aborted.is_empty() && done.blocked.is_empty());
    }
    let first = h.drain();
    assert_eq!(first.len(), 2, "{first:?}");
    // The rest merged into one delta, sent once there is room again...
    h.step(&[], None, 100);
    let second = h.drain();
    assert_eq!(second.len(), 1, "{second:?}");
    // ...and the finish arrives as one more delta and `done`.
    h.step(&[], Some(FinishReason::Length), 101);
    let all: Vec<StreamEvent> = first.into_iter().chain(second).chain(h.drain()).collect();
    assert_eq!(text_of(&all), text);
    assert_eq!(tokens_of(&all), ids.len());
    assert_eq!(done_of(&all).1.completion_tokens, ids.len());
}

#[test]
fn logprobs_travel_with_their_tokens_through_merged_deltas() {
    // As the slow reader above, with log-probabilities: one entry per token, in order.
    let mut h = Harness::new(&[], 2, true);
    let ids = h.ids("the quick brown fox jumps");
    let lp = |i: usize, id: u32| TokenLogprobs {
        token: id,
        logprob: -(i as f32),
        top: vec![(id, -(i as f32)), (7, -9.0)],
    };
    let mut blocked = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let last = i + 1 == ids.len();
        let finished = last.then_some(FinishReason::Length);
        let done = h.step_with_logprobs(&[id], vec![lp(i, id)], finished, i as u64);
        blocked.extend(done.blocked.into_iter().flat_map(|b| b.events));
        if i == 1 {
            h.drain(); // a reader that reads now and then
        }
    }
    let mut evs = h.drain();
    evs.extend(blocked);
    let got: Vec<TokenLogprobs> = evs
        .iter()
        .flat_map(|e| match e {
            StreamEvent::Delta {
                logprobs, tokens, ..
            } => {
                assert_eq!(logprobs.len(), *tokens, "{e:?}");
                logprobs.clone()
            }
            _ => Vec::new(),
        })
        .collect();
    let want: Vec<TokenLogprobs> = (1..ids.len()).map(|i| lp(i, ids[i])).collect();
    assert_eq!(got, want);
}

#[test]
fn terminal_events_wait_for_room_instead_of_being_lost() {
    let mut h = Harness::new(&[], 2, true);
    let ids = h.ids("the quick brown fox");
    h.step(&ids[..2], None, 1); // `started` + this delta fill the channel
    let mut done = h.step(&ids[2..], Some(FinishReason::Length), 2);
    assert_eq!(done.blocked.len(), 1);
    let blocked = done.blocked.pop().unwrap();
    assert!(matches!(
        blocked.events[..],
        [StreamEvent::Delta { .. }, StreamEvent::Done { .. }]
    ));
    // The reader catches up; the delivery task then completes.
    let mut evs = h.drain();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(blocked.deliver());
    evs.extend(h.drain());
    assert_eq!(text_of(&evs), "the quick brown fox");
    assert_eq!(done_of(&evs).0, FinishReason::Length);
}

#[test]
fn closed_channel_cancels_the_request() {
    let mut h = Harness::new(&[], 64, true);
    let ids = h.ids("the quick brown");
    h.step(&ids[..1], None, 1);
    let (_, rx) = mpsc::channel(1);
    drop(std::mem::replace(&mut h.rx, rx));
    let done = h.step(&ids[1..], None, 2);
    assert_eq!(done.aborted, [ID]);
    assert!(!h.out.contains(ID));
    // A closed channel at the end drops the terminal events quietly.
    let mut h = Harness::new(&[], 64, true);
    drop(std::mem::replace(&mut h.rx, mpsc::channel(1).1));
    let done = h.step(&ids, Some(FinishReason::Length), 2);
    assert!(done.aborted.is_empty() && done.blocked.is_empty());
    assert!(h.out.is_empty());
}

#[test]
fn cancel_releases_held_text_then_done_cancelled() {
    let mut h = Harness::new(&["fox!"], 64, true);
    h.drain();
    let ids = h.ids("a fox");
    h.step(&ids, None, 1);
    let mut done = Processed::default();
    h.out.cancel(ID, h.at(5), &mut done);
    let evs = h.drain();
    assert_eq!(text_of(&evs), "a fox");
    assert_eq!(done_of(&evs).0, FinishReason::Cancelled);
    h.out.cancel(ID, h.at(6), &mut done);
    assert_eq!(done.aborted, [ID], "once: the core drops it once");
    assert!(h.drain().is_empty());
}

#[test]
fn abort_is_silent_and_fail_ends_with_the_error() {
    let mut h = Harness::new(&[], 64, true);
    h.drain();
    let mut done = Processed::default();
    h.out.abort(ID, &mut done);
    h.out.abort(ID, &mut done);
    assert_eq!(done.aborted, [ID]);
    assert!(h.drain().is_empty());

    let mut h = Harness::new(&[], 64, true);
    h.drain();
    let mut done = Processed::default();
    let err = EngineError::Internal("boom".into());
    h.out.fail(ID, err.clone(), &mut done);
    assert_eq!(done.aborted, [ID]);
    assert_eq!(h.drain(), [StreamEvent::Error(err)]);
}

#[test]
fn without_a_tokenizer_deltas_count_tokens() {
    let mut h = Harness::new(&[], 64, false);
    h.drain();
    h.step(&[5], None, 1);
    h.step(&[6, 7], None, 2);
    h.step(&[8], Some(FinishReason::Length), 3);
    let evs = h.drain();
    let deltas: Vec<(String, usize)> = evs
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Delta { text, tokens, .. } => Some((text.clone(), *tokens)),
            _ => None,
        })
        .collect();
    assert_eq!(
        deltas,
        [(String::new(), 1), (String::new(), 2), (String::new(), 1)]
    );
    assert_eq!(done_of(&evs).1.completion_tokens, 4);
}

/// A request with `n` choices (ids `ID .. ID + n`) on a roomy channel, counting tokens only.
fn group(n: usize, capacity: usize) -> (OutputProcessor, mpsc::Receiver<StreamEvent>, Instant) {
    let mut out = OutputProcessor::new(None, Arc::new(Metrics::new()));
    let (tx, rx) = mpsc::channel(capacity);
    let t0 = Instant::now();
    out.add_request(ID, n, 3, None, tx, None, t0);
    (out, rx, t0)
}

fn update(id: u64, tokens: usize, finished: Option<FinishReason>) -> RequestUpdate {
    RequestUpdate {
        id: RequestId(id),
        new_token_ids: vec![5; tokens],
        finished,
        num_computed_tokens: 0,
        num_output_tokens: 0,
        logprobs: Vec::new(),
    }
}

fn drain_rx(rx: &mut mpsc::Receiver<StreamEvent>) -> Vec<StreamEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

#[test]
fn n_choices_stream_with_their_index_and_one_done_counts_them_all() {
    let (mut out, mut rx, t0) = group(3, 64);
    let at = |ms| t0 + Duration::from_millis(ms);
    // Choice 0 is scheduled (the others fork from it and are never scheduled themselves).
    out.scheduled(&[ID], at(5));
    let d = out.process(&[update(7, 1, None), update(8, 2, None)], at(10), false);
    assert!(d.aborted.is_empty());
    let d = out.process(
        &[update(8, 1, Some(FinishReason::Stop)), update(9, 1, None)],
        at(20),
        false,
    );
    assert!(d.aborted.is_empty() && d.blocked.is_empty());
    out.process(&[update(7, 1, Some(FinishReason::Length))], at(30), false);
    out.process(&[update(9, 4, Some(FinishReason::Length))], at(40), false);
    let evs = drain_rx(&mut rx);
    let tokens = |i: usize| -> usize {
        evs.iter()
            .map(|e| match e {
                StreamEvent::Delta { index, tokens, .. } if *index == i => *tokens,
                _ => 0,
            })
            .sum()
    };
    assert_eq!((tokens(0), tokens(1), tokens(2)), (2, 3, 5));
    let choice_done: Vec<(usize, FinishReason, usize)> = evs
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ChoiceDone {
                index,
                finish_reason,
                completion_tokens,
            } => Some((*index, *finish_reason, *completion_tokens)),
            _ => None,
        })
        .collect();
    assert_eq!(
        choice_done,
        [(1, FinishReason::Stop, 3), (0, FinishReason::Length, 2)]
    );
    assert_eq!(evs.iter().filter(|e| e.is_terminal()).count(), 1);
    match evs.last() {
        Some(StreamEvent::Done {
            index,
            usage,
            timing,
            ..
        }) => {
            assert_eq!(*index, 2);
            assert_eq!(usage.completion_tokens, 10, "every choice counts");
            assert_eq!(usage.prompt_tokens, 3);
            assert_eq!(timing.ttft_ms, Some(10.0), "the first choice's first token");
            assert_eq!(timing.queue_ms, 5.0, "until the first choice was scheduled");
        }
        other => panic!("expected done last, got {other:?}"),
    }
    assert!(out.is_empty());
}

#[test]
fn a_request_cancelled_before_its_first_token_has_no_ttft() {
    let mut h = Harness::new(&[], 64, true);
    h.drain();
    let mut done = Processed::default();
    h.out.cancel(ID, h.at(20), &mut done);
    let (reason, usage, timing) = done_of(&h.drain());
    assert_eq!(reason, FinishReason::Cancelled);
    assert_eq!(usage.completion_tokens, 0);
    assert_eq!(timing.ttft_ms, None);
    assert_eq!(h.metrics.ttft.get_sample_count(), 0);
}

#[test]
fn cancelling_or_aborting_an_n_request_ends_every_choice() {
    let (mut out, mut rx, t0) = group(2, 64);
    let mut done = Processed::default();
    out.cancel(ID, t0, &mut done);
    assert_eq!(done.aborted, [RequestId(7), RequestId(8)]);
    let evs = drain_rx(&mut rx);
    assert!(
        matches!(evs.last(), Some(StreamEvent::Done { .. })),
        "{evs:?}"
    );
    assert!(out.is_empty());

    let (mut out, _rx, _) = group(3, 64);
    let mut done = Processed::default();
    out.process(&[update(8, 1, Some(FinishReason::Stop))], t0, false);
    out.abort(ID, &mut done);
    assert_eq!(done.aborted, [RequestId(7), RequestId(9)]);
    assert!(out.is_empty());

    // A failed step naming one choice fails the request once, for all of them.
    let (mut out, mut rx, _) = group(2, 64);
    let mut done = Processed::default();
    out.fail(
        RequestId(8),
        EngineError::Internal("boom".into()),
        &mut done,
    );
    assert_eq!(done.aborted, [RequestId(7), RequestId(8)]);
    let evs = drain_rx(&mut rx);
    assert_eq!(evs.iter().filter(|e| e.is_terminal()).count(), 1, "{evs:?}");
    assert!(out.is_empty());
}

#[test]
fn a_choice_that_ends_on_a_full_channel_is_held_before_the_done() {
    // Room for Started and one more event.
    let (mut out, mut rx, t0) = group(2, 2);
    out.process(&[update(7, 1, None)], t0, false);
    out.process(&[update(8, 1, Some(FinishReason::Stop))], t0, false);
    let d = out.process(&[update(7, 1, Some(FinishReason::Length))], t0, false);
    let mut evs = drain_rx(&mut rx);
    for b in d.blocked {
        evs.extend(b.events);
    }
    let kinds: Vec<&str> = evs
        .iter()
        .map(|e| match e {
            StreamEvent::Started { .. } => "started",
            StreamEvent::Delta { .. } => "delta",
            StreamEvent::ChoiceDone { .. } => "choice_done",
            StreamEvent::Done { .. } => "done",
            StreamEvent::Error(_) => "error",
        })
        .collect();
    assert_eq!(
        kinds,
        ["started", "delta", "delta", "choice_done", "delta", "done"]
    );
}

/// The choices of an `n > 1` request share their socket's backlog: a trip fails the request
/// once (one error for all choices), and an abort returns the text its ended choices held.
#[test]
fn n_choices_share_the_sockets_backlog() {
    let tok = Arc::new(TokFixture::default().build());
    let metrics = Arc::new(Metrics::new());
    let prompt = tok.encode("Hello", true).unwrap();
    let word = tok.encode(" fox", false).unwrap();
    let upd = |id: u64, finished| RequestUpdate {
        id: RequestId(id),
        new_token_ids: word.clone(),
        logprobs: Vec::new(),
        finished,
        num_computed_tokens: 0,
        num_output_tokens: 0,
    };
    let t0 = Instant::now();
    // Tripped: 3 choices x 4 bytes a step, past 20 bytes in the 2nd step.
    let mut out = OutputProcessor::new(Some(tok.clone()), metrics.clone());
    let b = Backlog::new(20, metrics.ws_unread_bytes.clone());
    let (tx, mut rx) = mpsc::channel(64);
    let text = TextOutput::new(&tok, &prompt, &[], 0);
    out.add_request(ID, 3, prompt.len(), Some(text), tx, Some(b.clone()), t0);
    let ids = [ID.0, ID.0 + 1, ID.0 + 2];
    let step = |out: &mut OutputProcessor| {
        let ups: Vec<RequestUpdate> = ids.iter().map(|&i| upd(i, None)).collect();
        out.process(&ups, t0, false)
    };
    assert!(step(&mut out).aborted.is_empty());
    let mut done = step(&mut out);
    done.aborted.sort();
    assert_eq!(done.aborted, ids.map(RequestId));
    assert!(out.is_empty());
    let evs = drain_rx(&mut rx);
    let errors = evs
        .iter()
        .filter(|e| matches!(e, StreamEvent::Error(_)))
        .count();
    assert_eq!(errors, 1, "{evs:?}");

    // Aborted: one choice ended on a full channel (its text held), then the client left.
    let b = Backlog::new(1 << 20, metrics.ws_unread_bytes.clone());
    let (tx, _rx) = mpsc::channel(2);
    let text = TextOutput::new(&tok, &prompt, &[], 0);
    out.add_request(ID, 2, prompt.len(), Some(text), tx, Some(b.clone()), t0);
    out.process(&[upd(ID.0, None)], t0, false);
    out.process(&[upd(ID.0 + 1, Some(FinishReason::Length))], t0, false);
    assert!(b.bytes() > 4, "a delta queued, the rest pending or held");
    let mut done = Processed::default();
    out.abort(ID, &mut done);
    assert_eq!(b.bytes(), 4, "only the queued delta is left unread");
}

/// A socket that stops taking its output: once its unread text passes the limit, every request
/// of that socket ends with `slow_consumer` (and goes back to the core), another socket's
/// request carries on, and the bytes the socket took or that were dropped leave the count.
#[test]
fn a_socket_past_its_unread_limit_loses_all_its_requests_and_only_those() {
    let tok = Arc::new(TokFixture::default().build());
    let metrics = Arc::new(Metrics::new());
    let mut out = OutputProcessor::new(Some(tok.clone()), metrics.clone());
    let t0 = Instant::now();
    let prompt = tok.encode("Hello", true).unwrap();
    let slow = Backlog::new(40, metrics.ws_unread_bytes.clone());
    let fine = Backlog::new(40, metrics.ws_unread_bytes.clone());
    let mut rxs = Vec::new();
    for (i, b) in [&slow, &slow, &fine].into_iter().enumerate() {
        let (tx, rx) = mpsc::channel(2);
        let text = TextOutput::new(&tok, &prompt, &[], 0);
        out.add_request(
            RequestId(i as u64),
            1,
            prompt.len(),
            Some(text),
            tx,
            Some(b.clone()),
            t0,
        );
        rxs.push(rx);
    }
    let word = tok.encode(" fox", false).unwrap();
    let step = |out: &mut OutputProcessor, ids: &[u64]| {
        let updates: Vec<RequestUpdate> = (ids.iter())
            .map(|&i| RequestUpdate {
                id: RequestId(i),
                new_token_ids: word.clone(),
                logprobs: Vec::new(),
                finished: None,
                num_computed_tokens: 0,
                num_output_tokens: 0,
            })
            .collect();
        out.process(&updates, t0, false)
    };
    // The fine socket reads every step; the slow one never does.
    let mut tripped_at = None;
    for n in 1..=20 {
        let done = step(&mut out, &[0, 1, 2]);
        while let Ok(ev) = rxs[2].try_recv() {
            if let StreamEvent::Delta { text, .. } = ev {
                fine.taken(delta_bytes(&text, &[]));
            }
        }
        if !done.aborted.is_empty() {
            let mut aborted = done.aborted.clone();
            aborted.sort();
            assert_eq!(aborted, [RequestId(0), RequestId(1)]);
            tripped_at = Some(n);
            break;
        }
    }
    // 2 requests x 4 bytes a step: past 40 bytes in the 6th step.
    assert_eq!(tripped_at, Some(6));
    assert!(slow.is_tripped() && !fine.is_tripped());
    assert!(out.contains(RequestId(2)) && !out.contains(RequestId(0)));
    for rx in &mut rxs[..2] {
        let mut evs = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            evs.push(ev);
        }
        // Started and one delta filled the channel; the error waits for room (blocked).
        assert!(matches!(
            evs[..],
            [StreamEvent::Started { .. }, StreamEvent::Delta { .. }]
        ));
    }
    let done = step(&mut out, &[0, 1, 2]);
    assert!(done.aborted.is_empty(), "the fine socket's request goes on");
    // Pending text of the failed requests was dropped: only the two queued deltas are unread.
    assert_eq!(slow.bytes(), 8, "{}", slow.bytes());
}

/// Log-probabilities count toward a socket's unread output (`delta_bytes`), not only text: a
/// reader that asked for 20 alternatives a token and stops reading trips the limit as soon
/// as they pass it, and what it never took leaves the count when its request goes.
#[test]
fn unread_log_probabilities_count_toward_the_limit() {
    let mut h = Harness::new(&[], 2, true);
    let b = Backlog::new(10_000, h.metrics.ws_unread_bytes.clone());
    let prompt = h.tok.encode("Hello", true).unwrap();
    let text = TextOutput::new(&h.tok, &prompt, &[], 0);
    let (tx, mut rx) = mpsc::channel(2);
    let id = RequestId(100);
    h.out
        .add_request(id, 1, prompt.len(), Some(text), tx, Some(b.clone()), h.t0);
    let word = h.ids(" fox");
    let entry = TokenLogprobs {
        token: word[0],
        logprob: -0.5,
        top: vec![(word[0], -0.5); 20],
    };
    let per_step = delta_bytes(" fox", &vec![entry.clone(); word.len()]);
    assert!(per_step > 20 * word.len() * 40, "{per_step}");
    let mut tripped_at = None;
    for n in 1..=20 {
        let u = RequestUpdate {
            id,
            new_token_ids: word.clone(),
            logprobs: vec![entry.clone(); word.len()],
            finished: None,
            num_computed_tokens: 0,
            num_output_tokens: 0,
        };
        let done = h.out.process(&[u], h.at(n), false);
        if !done.aborted.is_empty() {
            tripped_at = Some(n as usize);
            break;
        }
    }
    assert_eq!(tripped_at, Some(10_000 / per_step + 1));
    assert!(b.is_tripped());
    // Started and one delta are queued (never read); the rest was dropped with the request.
    let queued: usize = std::iter::from_fn(|| rx.try_recv().ok())
        .map(|ev| match ev {
            StreamEvent::Delta { text, logprobs, .. } => delta_bytes(&text, &logprobs),
            _ => 0,
        })
        .sum();
    assert_eq!(b.bytes(), queued);
}
