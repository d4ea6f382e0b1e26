//! Stop strings over streamed text: text that could still be the start of a stop string is held
//! back until it can no longer match; when a stop string completes, only the text before it is
//! emitted. The stop string itself is never emitted.

/// What one [`StopChecker::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutcome {
    /// Text that can no longer be part of a stop string.
    pub emit: String,
    /// A stop string completed; `emit` ends where it began and nothing more will be emitted.
    pub stopped: bool,
}

#[derive(Debug, Clone)]
pub struct StopChecker {
    stops: Vec<String>,
    /// Bytes of the longest stop string: held text never reaches this length.
    max_len: usize,
    /// Text that is a proper prefix of some stop string; never contains a whole one.
    held: String,
    stopped: bool,
}

impl StopChecker {
    /// Empty stop strings are ignored (request validation already rejects them).
    pub fn new(stop: &[String]) -> Self {
        let stops: Vec<String> = stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        StopChecker {
            stops,
            max_len,
            held: String::with_capacity(max_len),
            stopped: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome {
                emit: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(text);

        // The stop string that completes first wins (on a tie, the longer one, which starts
        // earlier), so the result does not depend on how the text was split into deltas. Held text
        // contains no whole stop string, so every match ends inside `text`; searching all of
        // `held` is still cheap because it is shorter than the longest stop string plus `text`.
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at + s.len(), at)))
            .min();
        if let Some((_, at)) = first_match {
            self.held.truncate(at);
            self.stopped = true;
            return StopOutcome {
                emit: std::mem::take(&mut self.held),
                stopped: true,
            };
        }

        let keep_from = self.partial_match_start();
        let emit = self.held[..keep_from].to_owned();
        self.held.drain(..keep_from);
        StopOutcome {
            emit,
            stopped: false,
        }
    }

    /// Releases held text when generation ends for another reason (eos, length). After a stop
    /// string matched there is nothing to release.
    pub fn flush(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// The earliest char boundary from which the held text is still a prefix of some stop string,
    /// or `held.len()` when no suffix can grow into a match.
    fn partial_match_start(&self) -> usize {
        let lowest = self
            .held
            .len()
            .saturating_sub(self.max_len.saturating_sub(1));
        (lowest..self.held.len())
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    fn checker(stops: &[&str]) -> StopChecker {
        StopChecker::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// Pushes one char at a time; returns what was emitted and whether it stopped (flushing at
    /// the end when it did not).
    fn per_char(stops: &[&str], text: &str) -> (String, bool) {
        let mut c = checker(stops);
        let mut out = String::new();
        for ch in text.chars() {
            let o = c.push(ch.encode_utf8(&mut [0; 4]));
            out += &o.emit;
            if o.stopped {
                return (out, true);
            }
        }
        (out + &c.flush(), false)
    }

    #[test]
    fn stop_string_across_single_char_deltas_is_never_emitted() {
        assert_eq!(
            per_char(&["STOP"], "hello STOP world"),
            ("hello ".into(), true)
        );
        assert_eq!(
            per_char(&["\n\n"], "line one\nline two\n\nmore"),
            ("line one\nline two".into(), true)
        );
    }

    #[test]
    fn partial_prefix_is_held_then_released() {
        let mut c = checker(&["abc"]);
        assert_eq!(c.push("xa").emit, "x");
        assert_eq!(c.push("b").emit, "");
        // "abd" can no longer become "abc": all of it goes out.
        assert_eq!(c.push("d").emit, "abd");
        // A new partial match starts inside the same delta.
        assert_eq!(c.push("zzab").emit, "zz");
        assert_eq!(c.flush(), "ab");
        assert_eq!(c.flush(), "");
    }

    #[test]
    fn held_text_restarts_inside_itself() {
        // "aab": the held "aa" fails as "aa?" but its second "a" may still start "ab".
        let mut c = checker(&["ab"]);
        assert_eq!(c.push("a").emit, "");
        assert_eq!(c.push("a").emit, "a");
        let o = c.push("b");
        assert_eq!((o.emit.as_str(), o.stopped), ("", true));
    }

    #[test]
    fn multiple_and_overlapping_stop_strings() {
        // "bc" completes before "abcd" does, whether the text comes at once or char by char.
        assert_eq!(per_char(&["abcd", "bc"], "xabcd"), ("xa".into(), true));
        let mut c = checker(&["abcd", "bc"]);
        assert_eq!(
            c.push("xabcd"),
            StopOutcome {
                emit: "xa".into(),
                stopped: true
            }
        );
        // Same end: the longer one cuts more.
        assert_eq!(per_char(&["c", "abc"], "xxabc"), ("xx".into(), true));
        assert_eq!(
            per_char(&["<|end|>", "###"], "a ## b ### c"),
            ("a ## b ".into(), true)
        );
    }

    #[test]
    fn after_a_stop_nothing_more_is_emitted() {
        let mut c = checker(&["x"]);
        assert_eq!(
            c.push("abxcd"),
            StopOutcome {
                emit: "ab".into(),
                stopped: true
            }
        );
        assert_eq!(
            c.push("more"),
            StopOutcome {
                emit: String::new(),
                stopped: true
            }
        );
        assert_eq!(c.flush(), "");
    }

    #[test]
    fn multi_byte_text_is_never_split() {
        // "é" and "ê" share their first UTF-8 byte; the held text must stay whole characters.
        assert_eq!(
            per_char(&["éa"], "café latte"),
            ("café latte".into(), false)
        );
        let mut c = checker(&["🚀!"]);
        assert_eq!(c.push("go 🚀").emit, "go ");
        assert_eq!(c.push("?").emit, "🚀?");
        assert_eq!(per_char(&["中文"], "说中国中文"), ("说中国".into(), true));
    }

    /// Reference: the first position where some stop string ends; cut before the longest one
    /// ending there.
    fn reference(stops: &[String], text: &str) -> (String, bool) {
        for end in 1..=text.len() {
            if !text.is_char_boundary(end) {
                continue;
            }
            if let Some(s) = stops
                .iter()
                .filter(|s| text[..end].ends_with(s.as_str()))
                .max_by_key(|s| s.len())
            {
                return (text[..end - s.len()].to_owned(), true);
            }
        }
        (text.to_owned(), false)
    }

    const ALPHABET: &[char] = &['a', 'b', 'c', ' ', 'é', '中', '🚀'];

    #[test]
    fn random_deltas_match_the_reference_and_release_as_early_as_possible() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let mut stops_hit = 0;
        for _ in 0..2000 {
            fn word(rng: &mut impl Rng, max: usize) -> String {
                let n = rng.random_range(1..=max);
                (0..n)
                    .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
                    .collect()
            }
            let n_stops = rng.random_range(1..=3);
            let stops: Vec<String> = (0..n_stops).map(|_| word(&mut rng, 3)).collect();
            let text = word(&mut rng, 30);
            let chars: Vec<char> = text.chars().collect();

            let mut c = StopChecker::new(&stops);
            let (mut out, mut stopped, mut i) = (String::new(), false, 0);
            while i < chars.len() && !stopped {
                let n = rng.random_range(1..=4).min(chars.len() - i);
                let delta: String = chars[i..i + n].iter().collect();
                i += n;
                let o = c.push(&delta);
                out += &o.emit;
                stopped = o.stopped;
                if !stopped {
                    // What is held could still start a stop string, and nothing emitted could.
                    let seen: String = chars[..i].iter().collect();
                    assert!(seen.starts_with(&out));
                    let held = &seen[out.len()..];
                    assert!(held.is_empty() || stops.iter().any(|s| s.starts_with(held)));
                    for (j, _) in out.char_indices() {
                        let tail = &seen[j..];
                        assert!(
                            !stops.iter().any(|s| s.starts_with(tail)),
                            "{tail:?} {stops:?}"
                        );
                    }
                }
            }
            if !stopped {
                out += &c.flush();
            }
            stops_hit += usize::from(stopped);
            assert_eq!(
                (out, stopped),
                reference(&stops, &text),
                "{stops:?} {text:?}"
            );
        }
        assert!(stops_hit > 100 && stops_hit < 1900, "{stops_hit}");
    }
}
