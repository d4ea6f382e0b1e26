//! N-gram prompt lookup (vLLM's `ngram` method, "prompt lookup decoding"): the last n tokens of
//! a request (n from `max_n` down to `min_n`) are looked up earlier in its prompt and output;
//! the tokens that followed their latest earlier occurrence are the drafts. No model, no state:
//! it pays off where text repeats (code edits, quotes, templated answers) and costs nothing
//! where it finds no match (no draft positions are filled, nothing is verified).
//!
//! Cost: a backward scan of the request's tokens per n, O(len · n) comparisons at worst; the
//! scan checks the last token first, so a mismatch costs one comparison.

use super::proposer::{Proposal, ProposeRequest, ProposeStats, Proposer};

#[derive(Debug, Clone)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
}

impl NgramProposer {
    pub fn new(min_n: usize, max_n: usize) -> Self {
        assert!(
            min_n >= 1 && min_n <= max_n,
            "1 <= min_n <= max_n, got {min_n}, {max_n}"
        );
        NgramProposer { min_n, max_n }
    }
}

/// Up to `k` tokens that followed the latest earlier occurrence of the longest suffix of
/// `tokens` (between `min_n` and `max_n` tokens long) that occurred before; empty with none.
pub fn lookup(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> &[u32] {
    let len = tokens.len();
    if k == 0 {
        return &[];
    }
    for n in (min_n..=max_n.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        let last = suffix[n - 1];
        // Occurrences starting at i < len - n: never the suffix itself, and at least one token
        // follows each.
        for i in (0..len - n).rev() {
            if tokens[i + n - 1] == last && &tokens[i..i + n] == suffix {
                let start = i + n;
                return &tokens[start..(start + k).min(len)];
            }
        }
    }
    &[]
}

impl Proposer for NgramProposer {
    fn propose(
        &mut self,
        reqs: &[ProposeRequest],
        out: &mut Vec<Proposal>,
    ) -> anyhow::Result<ProposeStats> {
        out.clear();
        out.extend(reqs.iter().map(|r| Proposal {
            tokens: lookup(r.tokens, self.min_n, self.max_n, r.max_drafts).to_vec(),
            probs: Vec::new(),
        }));
        Ok(ProposeStats::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_match_of_the_longest_suffix() {
        // "a b c d a b c" → after the earlier "a b c" came "d a b".
        let t = [1, 2, 3, 4, 1, 2, 3];
        assert_eq!(lookup(&t, 2, 3, 3), &[4, 1, 2]);
        assert_eq!(lookup(&t, 2, 3, 1), &[4]);
        // The continuation stops at the end of the known tokens.
        assert_eq!(lookup(&t, 2, 3, 10), &[4, 1, 2, 3]);
    }

    #[test]
    fn the_latest_occurrence_wins_and_longer_suffixes_first() {
        // Suffix [7, 8]: earlier at 0 (then 9) and at 4 (then 5); the latest is taken.
        let t = [7, 8, 9, 0, 7, 8, 5, 6, 7, 8];
        assert_eq!(lookup(&t, 2, 2, 1), &[5]);
        // With n = 3, [6, 7, 8] never occurred before; n = 2 still matches.
        assert_eq!(lookup(&t, 2, 3, 1), &[5]);
        // [0, 7, 8] did occur (at 3): n = 3 wins over n = 2's later match.
        let t = [0, 7, 8, 1, 7, 8, 2, 0, 7, 8];
        assert_eq!(lookup(&t, 2, 3, 2), &[1, 7]);
    }

    #[test]
    fn no_match_no_drafts() {
        assert!(lookup(&[1, 2, 3, 4], 2, 3, 4).is_empty());
        assert!(lookup(&[5], 1, 3, 4).is_empty());
        assert!(lookup(&[5, 5], 1, 1, 0).is_empty());
        // A run repeats itself: [5] after [5].
        assert_eq!(lookup(&[5, 5], 1, 1, 3), &[5]);
    }

    #[test]
    fn the_proposer_respects_each_requests_depth() {
        use crate::request::RequestId;
        use crate::sampling::params::SamplingParams;
        let params = std::sync::Arc::new(SamplingParams::default());
        let t = [1, 2, 3, 4, 1, 2, 3];
        let req = |k| ProposeRequest {
            id: RequestId(1),
            tokens: &t,
            block_table: &[],
            max_drafts: k,
            params: &params,
            seed: 0,
            output_index: 0,
        };
        let mut p = NgramProposer::new(2, 3);
        let mut out = Vec::new();
        p.propose(&[req(2), req(1)], &mut out).unwrap();
        assert_eq!(out[0].tokens, vec![4, 1]);
        assert_eq!(out[1].tokens, vec![4]);
        assert!(out[0].probs.is_empty());
    }
}
