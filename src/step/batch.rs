//! The flattened, paged batch one engine step hands to a backend. It mixes prefill chunks and
//! decode tokens of many sequences, so the CPU and CUDA backends take the same input.
//!
//! Layout (num_tokens = sum of query_len over seqs, sequences contiguous in seq order):
//!   token_ids     [num_tokens]  input token per position
//!   positions     [num_tokens]  absolute position of each token in its sequence
//!   slot_mapping  [num_tokens]  KV slot each token's K/V is written to: block_id * block_size + offset
//!   seqs          [num_seqs]    per-sequence query_len, context_len, block table and sampling

use std::sync::Arc;

use crate::request::RequestId;
use crate::sampling::params::SamplingParams;

#[derive(Debug, Clone)]
pub struct SeqInput {
    pub request_id: RequestId,
    /// Tokens of this sequence in this step (a prefill chunk, or 1 for a decode).
    pub query_len: usize,
    /// Tokens in the KV cache once this step has run (cached prefix + query_len).
    pub context_len: usize,
    /// Physical block ids covering positions 0..context_len, in order.
    pub block_table: Vec<u32>,
    /// Some when this step ends the sequence's known tokens, so a new token is sampled.
    pub sample: Option<SampleInput>,
}

#[derive(Debug, Clone)]
pub struct SampleInput {
    pub params: Arc<SamplingParams>,
    /// The request's seed: `params.seed`, or one drawn at admission when the client gave none.
    pub seed: u64,
    /// Index of the token about to be generated (0 for the first output token). With a seed this
    /// picks the random stream position, so output does not depend on batch composition or on
    /// preemption and recompute.
    pub output_index: usize,
}

#[derive(Debug, Clone, Default)]
pub struct BatchInput {
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub slot_mapping: Vec<u32>,
    pub seqs: Vec<SeqInput>,
}

impl BatchInput {
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn num_sampled(&self) -> usize {
        self.seqs.iter().filter(|s| s.sample.is_some()).count()
    }

    pub fn num_prefill_tokens(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| s.query_len > 1)
            .map(|s| s.query_len)
            .sum()
    }

    pub fn num_decode_seqs(&self) -> usize {
        self.seqs.iter().filter(|s| s.query_len == 1).count()
    }

    /// Sum of context lengths: the K/V tokens attention reads this step (cost-model input).
    pub fn kv_tokens_read(&self) -> usize {
        self.seqs.iter().map(|s| s.context_len).sum()
    }

    /// Checks the invariants every backend relies on; a violation is a scheduler bug.
    pub fn validate(&self, block_size: usize, num_blocks: usize) -> Result<(), String> {
        let n = self.token_ids.len();
        if self.positions.len() != n || self.slot_mapping.len() != n {
            return Err(format!(
                "token_ids/positions/slot_mapping lengths differ: {n}/{}/{}",
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        let total: usize = self.seqs.iter().map(|s| s.query_len).sum();
        if total != n {
            return Err(format!("sum of query_len {total} != num_tokens {n}"));
        }
        let mut start = 0;
        for s in &self.seqs {
            if s.query_len == 0 || s.query_len > s.context_len {
                return Err(format!(
                    "{}: query_len {} vs context_len {}",
                    s.request_id, s.query_len, s.context_len
                ));
            }
            if s.block_table.len() * block_size < s.context_len {
                return Err(format!(
                    "{}: block table too short for {} tokens",
                    s.request_id, s.context_len
                ));
            }
            if let Some(b) = s.block_table.iter().find(|&&b| b as usize >= num_blocks) {
                return Err(format!("{}: block {b} out of range", s.request_id));
            }
            let first_pos = s.context_len - s.query_len;
            for i in 0..s.query_len {
                let pos = first_pos + i;
                if self.positions[start + i] as usize != pos {
                    return Err(format!(
                        "{}: position mismatch at token {}",
                        s.request_id,
                        start + i
                    ));
                }
                let slot = s.block_table[pos / block_size] as usize * block_size + pos % block_size;
                if self.slot_mapping[start + i] as usize != slot {
                    return Err(format!(
                        "{}: slot mismatch at token {}",
                        s.request_id,
                        start + i
                    ));
                }
            }
            start += s.query_len;
        }
        Ok(())
    }
}
