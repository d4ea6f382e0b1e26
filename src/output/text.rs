//! Per-request text output: generated ids → incremental detokenizer → stop strings → delta text.
//! The output processor calls [`TextOutput::push_tokens`] once per engine step per request.

use super::detok::IncrementalDetokenizer;
use super::stop::StopChecker;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextUpdate {
    /// Text for this step's delta; may be empty while text is held back.
    pub text: String,
    /// A stop string completed: finish the request with reason `stop`.
    pub stopped_by_string: bool,
    /// The step's tokens that count as output: all of them, or those up to and including the
    /// one that completed a stop string (a speculative step can bring tokens past it).
    pub tokens_used: usize,
}

#[derive(Debug, Clone)]
pub struct TextOutput {
    detok: IncrementalDetokenizer,
    /// None without stop strings, so text passes straight through without a copy.
    stop: Option<StopChecker>,
    /// Stop strings are looked for only in text of tokens from the `min_tokens`-th on (vLLM
    /// skips the check before); counts down to 0 as tokens arrive.
    unchecked_tokens: usize,
}

impl TextOutput {
    pub fn new(tok: &Tokenizer, prompt_ids: &[u32], stop: &[String], min_tokens: usize) -> Self {
        let stop = StopChecker::new(stop);
        TextOutput {
            detok: IncrementalDetokenizer::new(tok, prompt_ids),
            stop: (!stop.is_empty()).then_some(stop),
            unchecked_tokens: min_tokens,
        }
    }

    /// Whether a stop string has matched; later calls return no text.
    pub fn is_stopped(&self) -> bool {
        self.stop.as_ref().is_some_and(StopChecker::is_stopped)
    }

    /// One step's tokens. With stop strings, a step of several tokens (speculative decoding)
    /// goes through one token at a time, as single-token steps would: the tokens after the one
    /// that completes a stop string are not output (`tokens_used`), so usage and text do not
    /// depend on how many tokens a step brought.
    pub fn push_tokens(&mut self, tok: &Tokenizer, ids: &[u32]) -> TextUpdate {
        if self.stop.is_none() || ids.len() <= 1 {
            return self.push_step(tok, ids);
        }
        let mut all = TextUpdate::default();
        for id in ids {
            let one = self.push_step(tok, std::slice::from_ref(id));
            all.text.push_str(&one.text);
            all.tokens_used += one.tokens_used;
            if one.stopped_by_string {
                all.stopped_by_string = true;
                break;
            }
        }
        all
    }

    fn push_step(&mut self, tok: &Tokenizer, ids: &[u32]) -> TextUpdate {
        if self.is_stopped() {
            return TextUpdate {
                text: String::new(),
                stopped_by_string: true,
                tokens_used: 0,
            };
        }
        let text = self.detok.push(tok, ids);
        // Before min_tokens, text passes unchecked (a step's text is checked whole once it
        // reaches min_tokens).
        let unchecked = self.unchecked_tokens > ids.len();
        self.unchecked_tokens = self.unchecked_tokens.saturating_sub(ids.len());
        let (text, stopped_by_string) = match &mut self.stop {
            Some(stop) if !unchecked && !text.is_empty() => {
                let out = stop.push(&text);
                (out.emit, out.stopped)
            }
            _ => (text, false),
        };
        TextUpdate {
            text,
            stopped_by_string,
            tokens_used: ids.len(),
        }
    }

    /// Text still held back when the request finishes for a reason other than a stop string
    /// (eos, stop token, length). Held text can still complete a stop string here, in which case
    /// only the text before it is returned.
    pub fn finish(&mut self, tok: &Tokenizer) -> String {
        if self.is_stopped() {
            return String::new();
        }
        let tail = self.detok.flush(tok);
        match &mut self.stop {
            None => tail,
            Some(stop) => {
                let mut out = stop.push(&tail);
                if !out.stopped {
                    out.emit.push_str(&stop.flush());
                }
                out.emit
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::tokenizer_fixture::{random_text, TokFixture};

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    /// Streams the ids of `text` in random steps; returns the deltas and whether a stop string hit.
    fn run(
        tok: &Tokenizer,
        prompt: &[u32],
        text: &str,
        stop: &[String],
        rng: &mut impl Rng,
    ) -> (Vec<String>, bool) {
        let ids = tok.encode(text, false).unwrap();
        let mut out = TextOutput::new(tok, prompt, stop, 0);
        let mut deltas = Vec::new();
        let mut rest = &ids[..];
        while !rest.is_empty() {
            let n = rng.random_range(1..=3).min(rest.len());
            let u = out.push_tokens(tok, &rest[..n]);
            rest = &rest[n..];
            deltas.push(u.text);
            if u.stopped_by_string {
                assert!(out.is_stopped());
                // The scheduler finishes the request here; later calls give nothing.
                assert_eq!(out.push_tokens(tok, &ids[..1]).text, "");
                assert_eq!(out.finish(tok), "");
                return (deltas, true);
            }
        }
        deltas.push(out.finish(tok));
        (deltas, false)
    }

    #[test]
    fn without_stop_strings_text_is_the_decode() {
        let tok = TokFixture::default().build();
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        for _ in 0..100 {
            let text = random_text(&mut rng, 30);
            let (deltas, stopped) = run(&tok, &[0], &text, &[], &mut rng);
            assert!(!stopped);
            assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')));
            assert_eq!(deltas.concat(), text);
        }
    }

    #[test]
    fn stop_string_cuts_the_stream_and_is_not_emitted() {
        let tok = TokFixture::default().build();
        let mut rng = ChaCha8Rng::seed_from_u64(32);
        let prompt = tok.encode("Hello", true).unwrap();
        for _ in 0..50 {
            let before = random_text(&mut rng, 20).replace("🚀!", "");
            let text = format!("{before}🚀! after the stop");
            let stop = stops(&["🚀!", "never"]);
            let (deltas, stopped) = run(&tok, &prompt, &text, &stop, &mut rng);
            assert!(stopped);
            assert_eq!(deltas.concat(), before);
        }
    }

    /// A speculative step brings several tokens; those after the one that completes a stop
    /// string are not output: text and token count equal one-token steps'.
    #[test]
    fn tokens_after_a_stop_string_in_the_same_step_are_not_used() {
        let tok = TokFixture::default().build();
        let mut rng = ChaCha8Rng::seed_from_u64(34);
        let stop = stops(&["STOP", "🚀"]);
        for _ in 0..50 {
            let before = random_text(&mut rng, 12)
                .replace("STOP", "")
                .replace('🚀', "");
            let ids = tok
                .encode(&format!("{before} STOP and more text after"), false)
                .unwrap();
            let stream = |steps: &mut dyn FnMut() -> usize| {
                let mut out = TextOutput::new(&tok, &[0], &stop, 0);
                let (mut text, mut used, mut rest) = (String::new(), 0, &ids[..]);
                while !rest.is_empty() {
                    let n = steps().min(rest.len());
                    let u = out.push_tokens(&tok, &rest[..n]);
                    assert!(u.tokens_used <= n);
                    text += &u.text;
                    used += u.tokens_used;
                    rest = &rest[n..];
                    if u.stopped_by_string {
                        return (text, used);
                    }
                }
                panic!("no stop in {ids:?}");
            };
            let one = stream(&mut || 1);
            let many = stream(&mut || rng.random_range(2..=6));
            assert_eq!(many, one);
            assert!(one.1 < ids.len(), "{one:?}");
        }
    }

    #[test]
    fn held_prefix_is_released_at_finish() {
        let tok = TokFixture::default().build();
        let mut rng = ChaCha8Rng::seed_from_u64(33);
        let (deltas, stopped) = run(&tok, &[], "the end: STO", &stops(&["STOP"]), &mut rng);
        assert!(!stopped);
        assert!(!deltas[..deltas.len() - 1].concat().contains("STO"));
        assert!(deltas.last().unwrap().ends_with("STO"));
        assert_eq!(deltas.concat(), "the end: STO");
    }

    #[test]
    fn special_tokens_never_reach_the_text() {
        let tok = TokFixture::default().build();
        let mut out = TextOutput::new(&tok, &[0], &stops(&["zz"]), 0);
        let mut text = String::new();
        for id in tok
            .encode("Hi there", false)
            .unwrap()
            .into_iter()
            .chain([2, 1])
        {
            text += &out.push_tokens(&tok, &[id]).text;
        }
        text += &out.finish(&tok);
        assert_eq!(text, "Hi there");
    }

    #[test]
    fn stop_strings_wait_for_min_tokens() {
        let tok = TokFixture::default().build();
        let ids = tok.encode("ab STOP cd STOP ef", false).unwrap();
        // Tokens up to the one that completes the first STOP; one more is min_tokens.
        let first = (1..=ids.len())
            .find(|&k| tok.decode(&ids[..k], true).contains("STOP"))
            .unwrap();
        let mut out = TextOutput::new(&tok, &[0], &stops(&["STOP"]), first + 1);
        let mut text = String::new();
        for &id in &ids {
            let u = out.push_tokens(&tok, &[id]);
            text += &u.text;
            if u.stopped_by_string {
                break;
            }
        }
        // The first STOP came before min_tokens and stays in the text; the second stops it.
        assert!(out.is_stopped());
        assert_eq!(text, "ab STOP cd ");
    }
}
