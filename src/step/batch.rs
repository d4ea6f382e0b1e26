//! The flattened, paged batch one forward pass runs. It mixes prefill chunks and decode tokens of
//! many sequences, so the CPU and CUDA backends take the same input. The executor builds it from
//! its persistent input batch (`executor::input_batch`); tests and benchmarks may build one by
//! hand with [`BatchInput::push_seq`].
//!
//! Layout (num_tokens = sum of query_len over seqs, sequences contiguous in seq order):
//!   token_ids     [num_tokens]  input token per position
//!   positions     [num_tokens]  absolute position of each token in its sequence
//!   slot_mapping  [num_tokens]  KV slot each token's K/V is written to: block_id * block_size + offset
//!   seqs          [num_seqs]    per-sequence row, query_len, context_len and sampling
//!   block_tables  [rows, width] physical block ids per row; a sequence reads the row `seq.row`
//!
//! Rows are the executor's persistent slots: a request keeps its row from step to step, so its
//! block table is written once and then only appended to (the CUDA backend mirrors the rows on
//! the device and uploads only what changed) — except under a sliding window, where leading
//! entries whose blocks were freed behind the window become [`NULL_BLOCK`].

use std::sync::Arc;

use crate::request::RequestId;
use crate::sampling::params::SamplingParams;

/// The block-table entry of a block the KV manager freed because it lies wholly before the
/// sliding window of every later query of its sequence. It keeps positions at their index;
/// attention never reads it (`BatchInput::validate_window`), and no token is written to it.
pub const NULL_BLOCK: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct SeqInput {
    pub request_id: RequestId,
    /// Row of this sequence's block table in `BatchInput::block_tables`; distinct per sequence.
    pub row: usize,
    /// Tokens of this sequence in this step (a prefill chunk, or 1 for a decode).
    pub query_len: usize,
    /// Tokens in the KV cache once this step has run (cached prefix + query_len).
    pub context_len: usize,
    /// Some when this step ends the sequence's known tokens, so a new token is sampled.
    pub sample: Option<SampleInput>,
    /// Speculative decoding: draft tokens at the end of the query, after the last known token
    /// (0: none; only with `sample`). The forward returns logits at the last `num_drafts + 1`
    /// positions, which verify the drafts and give the token after the last accepted one.
    pub num_drafts: usize,
}

#[derive(Debug, Clone)]
pub struct SampleInput {
    pub params: Arc<SamplingParams>,
    /// The request's seed: `params.seed`, or one drawn at admission when the client gave none.
    pub seed: u64,
    /// Index of the token about to be generated (0 for the first output token). With a seed this
    /// picks the random stream position, so output does not depend on batch composition or on
    /// preemption and recompute. With drafts, draft `j` (from 0) stands at `output_index + j`.
    pub output_index: usize,
}

/// Block tables as one row-major array: row r holds `len(r)` block ids in position order, in a
/// slot of `width` entries. Rows and width grow on demand; a persistent owner sizes them once.
#[derive(Debug, Clone, Default)]
pub struct BlockTables {
    ids: Vec<u32>,
    lens: Vec<usize>,
    width: usize,
}

impl BlockTables {
    /// Empty tables whose rows hold `width` blocks before they need to widen.
    pub fn with_width(width: usize) -> Self {
        BlockTables {
            ids: Vec::new(),
            lens: Vec::new(),
            width,
        }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn num_rows(&self) -> usize {
        self.lens.len()
    }

    /// Row `r`'s block ids (empty past the last row).
    pub fn row(&self, r: usize) -> &[u32] {
        match self.lens.get(r) {
            Some(&n) => &self.ids[r * self.width..r * self.width + n],
            None => &[],
        }
    }

    /// Row `r` becomes `ids`.
    pub fn set_row(&mut self, r: usize, ids: &[u32]) {
        self.ensure(r, ids.len());
        self.ids[r * self.width..r * self.width + ids.len()].copy_from_slice(ids);
        self.lens[r] = ids.len();
    }

    /// Appends `ids` to row `r`.
    pub fn append(&mut self, r: usize, ids: &[u32]) {
        let n = self.row(r).len();
        self.ensure(r, n + ids.len());
        let at = r * self.width + n;
        self.ids[at..at + ids.len()].copy_from_slice(ids);
        self.lens[r] = n + ids.len();
    }

    /// Row `r` keeps its first `len` entries (at most its length).
    pub fn truncate_row(&mut self, r: usize, len: usize) {
        assert!(len <= self.row(r).len(), "row {r} is shorter than {len}");
        self.lens[r] = len;
    }

    /// Entries `cols` of row `r` (within its length) become `id`.
    pub fn fill(&mut self, r: usize, cols: std::ops::Range<usize>, id: u32) {
        assert!(
            cols.end <= self.row(r).len(),
            "columns {cols:?} past row {r}"
        );
        let at = r * self.width;
        self.ids[at + cols.start..at + cols.end].fill(id);
    }

    /// Row `to` becomes a copy of row `from`.
    pub fn copy_row(&mut self, from: usize, to: usize) {
        let n = self.row(from).len();
        self.ensure(to, n);
        self.ids
            .copy_within(from * self.width..from * self.width + n, to * self.width);
        self.lens[to] = n;
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        self.lens.truncate(rows);
        self.ids.truncate(rows * self.width);
    }

    /// Makes room for row `r` with `len` ids: more rows, or a wider layout (a copy, which a
    /// persistent owner that sized `width` for its longest sequence never pays).
    fn ensure(&mut self, r: usize, len: usize) {
        if len > self.width {
            let width = len.max(2 * self.width);
            let mut ids = vec![0; self.lens.len() * width];
            for (row, &n) in self.lens.iter().enumerate() {
                ids[row * width..row * width + n]
                    .copy_from_slice(&self.ids[row * self.width..row * self.width + n]);
            }
            self.ids = ids;
            self.width = width;
        }
        if r >= self.lens.len() {
            self.lens.resize(r + 1, 0);
            self.ids.resize((r + 1) * self.width, 0);
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct BatchInput {
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub slot_mapping: Vec<u32>,
    pub seqs: Vec<SeqInput>,
    pub block_tables: BlockTables,
}

impl BatchInput {
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// The block table of `seq` (its row).
    pub fn block_table(&self, seq: &SeqInput) -> &[u32] {
        self.block_tables.row(seq.row)
    }

    /// Appends a sequence computing `tokens` at positions `first_pos..` over `block_table`, in a
    /// row of its own (the next one). For batches built by hand (tests, benchmarks); the executor
    /// fills its persistent batch in place.
    pub fn push_seq(
        &mut self,
        request_id: RequestId,
        tokens: &[u32],
        first_pos: usize,
        block_table: &[u32],
        block_size: usize,
        sample: Option<SampleInput>,
    ) {
        let row = self.block_tables.num_rows();
        self.block_tables.set_row(row, block_table);
        self.token_ids.extend_from_slice(tokens);
        for pos in first_pos..first_pos + tokens.len() {
            self.positions.push(pos as u32);
            let slot = match block_table.get(pos / block_size) {
                Some(&b) if b != NULL_BLOCK => b * block_size as u32 + (pos % block_size) as u32,
                _ => u32::MAX,
            };
            self.slot_mapping.push(slot);
        }
        self.seqs.push(SeqInput {
            request_id,
            row,
            query_len: tokens.len(),
            context_len: first_pos + tokens.len(),
            sample,
            num_drafts: 0,
        });
    }

    pub fn num_sampled(&self) -> usize {
        self.seqs.iter().filter(|s| s.sample.is_some()).count()
    }

    /// Rows of logits the forward returns: one per sampling sequence, plus one per draft.
    pub fn num_logit_rows(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| s.sample.is_some())
            .map(|s| 1 + s.num_drafts)
            .sum()
    }

    /// Draft tokens verified by this step, over all sequences.
    pub fn num_drafts(&self) -> usize {
        self.seqs.iter().map(|s| s.num_drafts).sum()
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

    /// Sum of context lengths: the K/V tokens attention reads this step.
    pub fn kv_tokens_read(&self) -> usize {
        self.seqs.iter().map(|s| s.context_len).sum()
    }

    /// Checks the invariants every backend relies on; a violation is a bug of whoever built the
    /// batch.
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
        let mut rows_seen = vec![false; self.block_tables.num_rows()];
        let mut start = 0;
        for s in &self.seqs {
            match rows_seen.get_mut(s.row) {
                None => {
                    return Err(format!(
                        "{}: row {} has no block table",
                        s.request_id, s.row
                    ))
                }
                Some(true) => {
                    return Err(format!("{}: row {} used twice", s.request_id, s.row));
                }
                Some(seen) => *seen = true,
            }
            if s.query_len == 0 || s.query_len > s.context_len {
                return Err(format!(
                    "{}: query_len {} vs context_len {}",
                    s.request_id, s.query_len, s.context_len
                ));
            }
            if s.num_drafts > 0 && (s.sample.is_none() || s.num_drafts >= s.query_len) {
                return Err(format!(
                    "{}: {} drafts in a query of {} (sampled: {})",
                    s.request_id,
                    s.num_drafts,
                    s.query_len,
                    s.sample.is_some()
                ));
            }
            let table = self.block_table(s);
            if table.len() * block_size < s.context_len {
                return Err(format!(
                    "{}: block table too short for {} tokens",
                    s.request_id, s.context_len
                ));
            }
            if let Some(b) = table
                .iter()
                .find(|&&b| b as usize >= num_blocks && b != NULL_BLOCK)
            {
                return Err(format!("{}: block {b} out of range", s.request_id));
            }
            let first_pos = s.context_len - s.query_len;
            for i in 0..s.query_len {
                let pos = first_pos + i;
                if table[pos / block_size] == NULL_BLOCK {
                    return Err(format!(
                        "{}: position {pos} is written into a freed block",
                        s.request_id
                    ));
                }
                if self.positions[start + i] as usize != pos {
                    return Err(format!(
                        "{}: position mismatch at token {}",
                        s.request_id,
                        start + i
                    ));
                }
                let slot = table[pos / block_size] as usize * block_size + pos % block_size;
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

impl BatchInput {
    /// Checks that freed blocks ([`NULL_BLOCK`]) lie wholly before the attention window of each
    /// sequence's first query (so attention never reads them): anywhere under full attention
    /// (`window` None) is an error.
    pub fn validate_window(&self, block_size: usize, window: Option<usize>) -> Result<(), String> {
        for s in &self.seqs {
            let table = self.block_table(s);
            let Some(last_null) = table.iter().rposition(|&b| b == NULL_BLOCK) else {
                continue;
            };
            let first_pos = s.context_len - s.query_len;
            let visible_from = match window {
                Some(w) => (first_pos + 1).saturating_sub(w),
                None => 0,
            };
            if (last_null + 1) * block_size > visible_from {
                return Err(format!(
                    "{}: freed block {last_null} holds positions the attention window (from {visible_from}) reads",
                    s.request_id
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_tables_grow_rows_and_width_keeping_contents() {
        let mut t = BlockTables::with_width(2);
        t.set_row(1, &[7, 8]);
        assert_eq!(
            (t.num_rows(), t.row(0), t.row(1)),
            (2, &[][..], &[7, 8][..])
        );
        t.append(1, &[9]);
        assert!(t.width() >= 3);
        t.append(0, &[1]);
        assert_eq!((t.row(0), t.row(1)), (&[1][..], &[7, 8, 9][..]));
        t.copy_row(1, 0);
        assert_eq!(t.row(0), &[7, 8, 9]);
        t.truncate(1);
        assert_eq!((t.num_rows(), t.row(1)), (1, &[][..]));
    }

    #[test]
    fn push_seq_builds_a_valid_batch_and_validate_catches_shared_rows() {
        let mut b = BatchInput::default();
        b.push_seq(RequestId(1), &[5, 6, 7], 0, &[3], 4, None);
        b.push_seq(RequestId(2), &[9], 5, &[0, 2], 4, None);
        assert_eq!(b.slot_mapping, vec![12, 13, 14, 9]);
        assert_eq!(b.validate(4, 4), Ok(()));
        assert!(b.validate(4, 3).unwrap_err().contains("out of range"));
        b.seqs[1].row = 0;
        assert!(b.validate(4, 4).unwrap_err().contains("used twice"));
    }

    #[test]
    fn freed_blocks_are_valid_only_behind_the_window() {
        // Blocks of 4; a decode at position 9 (window 6 sees 4..=9) after block 0 was freed.
        let mut b = BatchInput::default();
        b.push_seq(RequestId(1), &[5], 9, &[NULL_BLOCK, 2, 3], 4, None);
        assert_eq!(b.validate(4, 4), Ok(()));
        assert_eq!(b.validate_window(4, Some(6)), Ok(()));
        // A wider window reads position 3, in the freed block; full attention reads it all.
        assert!(b
            .validate_window(4, Some(7))
            .unwrap_err()
            .contains("freed block 0"));
        assert!(b.validate_window(4, None).is_err());
        // No token is written into a freed block, whatever the window.
        let mut w = BatchInput::default();
        w.push_seq(RequestId(2), &[5], 1, &[NULL_BLOCK], 4, None);
        assert!(w.validate(4, 4).unwrap_err().contains("freed block"));
    }
}
