//! Incremental detokenization with prefix/read offsets, as in TGI and vLLM.
//!
//! A token's text depends on its neighbours: SentencePiece decoders strip the leading space of the
//! first token they see, and byte-level tokens may carry only part of a UTF-8 character. So each
//! step decodes a small window (the tokens emitted last time, the "prefix", plus the new ones) and
//! emits what the new ones added to the prefix's text. A trailing U+FFFD is an incomplete
//! character: the text before it goes out, the character is held back until a later token
//! completes it.
//!
//! Only the window is kept (`ids[prefix_offset..]` of the sequence), so each step costs
//! O(window), independent of how long the sequence has grown.

use crate::tokenizer::Tokenizer;

/// Prompt tokens kept as the first prefix, so the first generated token decodes with its correct
/// leading space (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
const PROMPT_TAIL: usize = 5;

/// The window slides only at a token boundary that ends on a whole character. Byte-level tokens
/// that each straddle two characters (rare CJK runs) can postpone that for a few tokens; bytes that
/// no token can complete (a model emitting invalid UTF-8) would postpone it forever, so past this
/// many pending tokens the held bytes go out as U+FFFD and the window slides anyway.
const MAX_PENDING_TOKENS: usize = 16;

const REPLACEMENT: char = '\u{FFFD}';

/// Per-request decoder state. Special tokens are skipped, as when decoding with
/// `skip_special_tokens = true`.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    /// Non-special ids from the prefix start onwards.
    window: Vec<u32>,
    /// `window[..read]` is the prefix: tokens whose text is already out (or is prompt text).
    read: usize,
    /// Bytes of `decode(window)` already out: the prefix's text, plus the complete characters
    /// emitted while an incomplete one is held back.
    emitted: usize,
}

impl IncrementalDetokenizer {
    pub fn new(tok: &Tokenizer, prompt_ids: &[u32]) -> Self {
        let mut window: Vec<u32> = prompt_ids
            .iter()
            .rev()
            .copied()
            .filter(|&id| !tok.is_special(id))
            .take(PROMPT_TAIL)
            .collect();
        window.reverse();
        let emitted = tok.decode(&window, true).len();
        IncrementalDetokenizer {
            read: window.len(),
            window,
            emitted,
        }
    }

    /// Adds newly generated ids and returns the text they complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, new_ids: &[u32]) -> String {
        let before = self.window.len();
        self.window
            .extend(new_ids.iter().copied().filter(|&id| !tok.is_special(id)));
        if self.window.len() == before {
            return String::new();
        }
        self.advance(tok, false)
    }

    /// Returns the text still held back at the end of generation. An incomplete trailing character
    /// comes out as U+FFFD: the model really did stop mid-character.
    pub fn flush(&mut self, tok: &Tokenizer) -> String {
        if self.read == self.window.len() {
            return String::new();
        }
        self.advance(tok, true)
    }

    fn advance(&mut self, tok: &Tokenizer, force: bool) -> String {
        let text = tok.decode(&self.window, true);
        let len = self.window.len();
        if force || !text.ends_with(REPLACEMENT) || len - self.read > MAX_PENDING_TOKENS {
            let out = self.take(&text, text.len());
            self.slide(tok, len, text.len());
            return out;
        }
        // An incomplete character at the end: release the text before it...
        let out = self.take(&text, text.trim_end_matches(REPLACEMENT).len());
        // ...and slide to a token boundary before it that ends on a whole character, if one of
        // the last few gives one, so that a run of such steps keeps the window short. (It is at
        // most 3 bytes, so its first byte is in one of the last 3 tokens.)
        let lowest = (self.read + 1).max(len.saturating_sub(3));
        for upto in (lowest..len).rev() {
            let head = tok.decode(&self.window[..upto], true);
            if !head.ends_with(REPLACEMENT) {
                self.slide(tok, upto, head.len());
                break;
            }
        }
        out
    }

    /// Takes `text[emitted..end]` (`text` = decode of the whole window) as output.
    fn take(&mut self, text: &str, end: usize) -> String {
        let start = char_boundary_at_or_after(text, self.emitted);
        let out = text.get(start..end).unwrap_or_default().to_owned();
        self.emitted = self.emitted.max(end);
        out
    }

    /// Makes `window[read..upto]` the next prefix; `upto_len` is the byte length of
    /// `decode(window[..upto])`, which ends on a whole character.
    fn slide(&mut self, tok: &Tokenizer, upto: usize, upto_len: usize) {
        let emitted_past_upto = self.emitted.saturating_sub(upto_len);
        self.window.drain(..self.read);
        self.read = upto - self.read;
        self.emitted = tok.decode(&self.window[..self.read], true).len() + emitted_past_upto;
    }
}

/// `at` itself when it is a char boundary of `text`. It is not only if a decoder rewrote earlier
/// text — e.g. a character that was released as U+FFFD after MAX_PENDING_TOKENS and completed
/// later — and then the rest of that character is skipped rather than split.
fn char_boundary_at_or_after(text: &str, at: usize) -> usize {
    (at..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::tokenizer_fixture::{random_text, TokFixture};

    /// Pushes `gen` in chunks of random size (1..=max_chunk) and returns every push's text plus
    /// the final flush, and how many pushes with new ids returned nothing.
    fn stream(
        tok: &Tokenizer,
        prompt: &[u32],
        gen: &[u32],
        max_chunk: usize,
        rng: &mut impl Rng,
    ) -> (Vec<String>, usize) {
        let mut detok = IncrementalDetokenizer::new(tok, prompt);
        let mut chunks = Vec::new();
        let mut held = 0;
        let mut rest = gen;
        while !rest.is_empty() {
            let n = rng.random_range(1..=max_chunk).min(rest.len());
            let text = detok.push(tok, &rest[..n]);
            assert!(detok.window.len() <= 2 * (MAX_PENDING_TOKENS + max_chunk) + PROMPT_TAIL);
            held += usize::from(text.is_empty());
            chunks.push(text);
            rest = &rest[n..];
        }
        chunks.push(detok.flush(tok));
        (chunks, held)
    }

    #[test]
    fn one_token_at_a_time_matches_full_decode_and_never_splits_a_char() {
        let tok = TokFixture::default().build();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut held_total = 0;
        for _ in 0..300 {
            let text = random_text(&mut rng, 40);
            let ids = tok.encode(&text, false).unwrap();
            assert_eq!(tok.decode(&ids, true), text, "fixture round trip");
            let (chunks, held) = stream(&tok, &[], &ids, 1, &mut rng);
            held_total += held;
            for c in &chunks {
                assert!(!c.contains('\u{FFFD}'), "broken char in {c:?} of {text:?}");
            }
            assert_eq!(chunks.concat(), text);
            // Flush has nothing left: every complete character was released on time.
            assert_eq!(chunks.last().unwrap(), "");
        }
        // Byte-level tokens that end inside a character really occurred and were held back.
        assert!(held_total > 0);
    }

    #[test]
    fn after_a_prompt_and_in_multi_token_steps() {
        let tok = TokFixture::default().build();
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        for _ in 0..200 {
            let prompt_text = random_text(&mut rng, 20);
            let gen_text = random_text(&mut rng, 30);
            let prompt = tok.encode(&prompt_text, true).unwrap();
            let gen = tok.encode(&gen_text, false).unwrap();
            let all: Vec<u32> = prompt.iter().chain(&gen).copied().collect();
            let full = tok.decode(&all, true);
            let expected = &full[tok.decode(&prompt, true).len()..];
            let (chunks, _) = stream(&tok, &prompt, &gen, 4, &mut rng);
            assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
            assert_eq!(chunks.concat(), expected);
        }
    }

    #[test]
    fn sentencepiece_random_words_match_full_decode() {
        let tok = TokFixture {
            metaspace: true,
            ..Default::default()
        }
        .build();
        const WORDS: &[&str] = &[
            "the", "quick", "fox", "Hello", "world", "tokens", "a", "of", ",",
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(14);
        let mut sentence = |n: usize| -> String {
            let words: Vec<&str> = (0..n)
                .map(|_| WORDS[rng.random_range(0..WORDS.len())])
                .collect();
            words.join(" ")
        };
        let cases: Vec<(String, String)> = (0..100)
            .map(|i| (sentence(1 + i % 5), sentence(1 + i % 7)))
            .collect();
        for (prompt_text, gen_text) in cases {
            let prompt = tok.encode(&prompt_text, false).unwrap();
            let all = tok
                .encode(&format!("{prompt_text} {gen_text}"), false)
                .unwrap();
            assert_eq!(&all[..prompt.len()], &prompt[..]);
            let gen = &all[prompt.len()..];
            let expected = &tok.decode(&all, true)[tok.decode(&prompt, true).len()..];
            assert!(expected.starts_with(' '), "{expected:?}");
            let (chunks, _) = stream(&tok, &prompt, gen, 3, &mut rng);
            assert_eq!(chunks.concat(), expected);
        }
    }

    #[test]
    fn special_tokens_are_skipped() {
        let tok = TokFixture::default().build();
        let mut ids = tok.encode("Hello", false).unwrap();
        ids.push(tok.token_to_id("<|eot|>").unwrap());
        ids.extend(tok.encode(" world", false).unwrap());
        ids.push(1);
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let (chunks, _) = stream(&tok, &[0], &ids, 1, &mut rng);
        assert_eq!(chunks.concat(), "Hello world");
    }

    #[test]
    fn sentencepiece_leading_space_comes_from_the_prompt_tail() {
        let tok = TokFixture {
            metaspace: true,
            ..Default::default()
        }
        .build();
        let prompt = tok.encode("Hello", false).unwrap();
        let gen = tok.encode("Hello world again", false).unwrap()[prompt.len()..].to_vec();
        // Decoded alone, the first generated token loses its "▁" space; the window fixes that.
        assert_eq!(tok.decode(&gen[..1], true), "world");
        let mut detok = IncrementalDetokenizer::new(&tok, &prompt);
        let text: String = gen.iter().map(|&id| detok.push(&tok, &[id])).collect();
        assert_eq!(text + &detok.flush(&tok), " world again");

        // Without a prompt the first token's space is dropped, exactly as a full decode does.
        let mut detok = IncrementalDetokenizer::new(&tok, &[]);
        let text: String = gen.iter().map(|&id| detok.push(&tok, &[id])).collect();
        assert_eq!(text, tok.decode(&gen, true));
    }

    #[test]
    fn invalid_bytes_are_released_and_the_window_stays_small() {
        let tok = TokFixture::default().build();
        // A single byte that is not valid UTF-8 on its own (e.g. a lone continuation byte); a
        // stream of them can never form a character.
        let lone = (0..tok.vocab_size() as u32)
            .find(|&id| tok.decode(&[id], true) == "\u{FFFD}")
            .expect("a single-byte token that is not valid UTF-8 alone");
        let mut detok = IncrementalDetokenizer::new(&tok, &[]);
        let mut out = String::new();
        for _ in 0..50 {
            out += &detok.push(&tok, &[lone]);
            assert!(detok.window.len() <= 2 * (MAX_PENDING_TOKENS + 1));
        }
        out += &detok.flush(&tok);
        assert_eq!(out, tok.decode(&[lone; 50], true));
    }
}
