//! A tensor-parallel rank's collectives over device buffers (`cuda::tp`), staged through the
//! host: the stream is drained, the buffer copied down, the ranks meet in a host
//! `Communicator` (`parallel::ThreadComm`), and the result copied back up. Correct on any set
//! of GPUs, one GPU included, but each collective stops the stream, so a world runs eagerly
//! (no CUDA graphs, no lookahead). NCCL, which reduces on the devices inside the stream, is
//! what a multi-GPU machine would run instead: not built (no such machine was lent).

use std::cell::RefCell;

use half::bf16;

use super::device::Gpu;
use crate::parallel::Communicator;

/// This rank's end of the world and what its forward needs to know of its vocabulary slice.
pub struct TpLink {
    comm: Box<dyn Communicator>,
    /// The first token id of this rank's rows of the embedding and LM head.
    pub vocab_start: usize,
    /// Rows of this rank's embedding and LM head (⌈V / N⌉; the last rank's padded with zeros).
    pub head_rows: usize,
    /// The whole vocabulary.
    vocab: usize,
    /// Host staging, reused across collectives (the forward enqueues through `&self`).
    stage: RefCell<Stage>,
}

#[derive(Default)]
struct Stage {
    f32s: Vec<f32>,
    bf16s: Vec<bf16>,
    gathered: Vec<f32>,
}

impl TpLink {
    pub fn new(comm: Box<dyn Communicator>, vocab: usize) -> Self {
        let world = comm.world_size();
        let head_rows = crate::model::shard::vocab_rows(vocab, world);
        TpLink {
            vocab_start: comm.rank() * head_rows,
            head_rows,
            vocab,
            comm,
            stage: RefCell::default(),
        }
    }

    /// `buf` (n fp32, on `gpu`'s stream) := the sum over the ranks of their `buf`.
    pub fn all_reduce_f32(&self, gpu: &Gpu, buf: u64, n: usize) -> anyhow::Result<()> {
        let mut s = self.stage.borrow_mut();
        s.f32s.resize(n, 0.0);
        gpu.download(&mut s.f32s, buf)?;
        self.comm.all_reduce_sum(&mut s.f32s)?;
        gpu.upload(buf, &s.f32s)
    }

    /// `buf` (n bf16) := the sum over the ranks of their `buf`, added in fp32 and rounded once.
    pub fn all_reduce_bf16(&self, gpu: &Gpu, buf: u64, n: usize) -> anyhow::Result<()> {
        let s = &mut *self.stage.borrow_mut();
        s.bf16s.resize(n, bf16::ZERO);
        gpu.download(&mut s.bf16s, buf)?;
        s.f32s.clear();
        s.f32s.extend(s.bf16s.iter().map(|x| x.to_f32()));
        self.comm.all_reduce_sum(&mut s.f32s)?;
        for (o, &x) in s.bf16s.iter_mut().zip(&s.f32s) {
            *o = bf16::from_f32(x);
        }
        gpu.upload(buf, &s.bf16s)
    }

    /// `logits` holds this rank's `[rows, head_rows]` fp32 slice of each row's logits, packed;
    /// afterwards it holds the whole `[rows, vocab]` on every rank.
    pub fn gather_logits(&self, gpu: &Gpu, logits: u64, rows: usize) -> anyhow::Result<()> {
        let s = &mut *self.stage.borrow_mut();
        s.f32s.resize(rows * self.head_rows, 0.0);
        gpu.download(&mut s.f32s, logits)?;
        self.comm.all_gather(&s.f32s, &mut s.gathered)?;
        let mut whole = std::mem::take(&mut s.f32s);
        assemble_logits(&s.gathered, rows, self.head_rows, self.vocab, &mut whole);
        let up = gpu.upload(logits, &whole);
        s.f32s = whole;
        up
    }
}

/// The ranks' logit slices (`gathered`: rank after rank, each `[rows, head_rows]`) put side by
/// side as `[rows, vocab]` in `out`, the last rank's padding dropped.
pub fn assemble_logits(
    gathered: &[f32],
    rows: usize,
    head_rows: usize,
    vocab: usize,
    out: &mut Vec<f32>,
) {
    let world = gathered.len() / (rows * head_rows).max(1);
    out.clear();
    out.reserve(rows * vocab);
    for i in 0..rows {
        for r in 0..world {
            let take = head_rows.min(vocab.saturating_sub(r * head_rows));
            let at = (r * rows + i) * head_rows;
            out.extend_from_slice(&gathered[at..at + take]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_slices_are_put_side_by_side_without_padding() {
        // A vocabulary of 7 over 3 ranks: 3 rows each, the last rank's third row padding.
        let (rows, head_rows, vocab) = (2, 3, 7);
        // Rank r, row i, column c holds the token id r·3 + c, plus 100·i; padding is -1.
        let mut gathered = Vec::new();
        for r in 0..3 {
            for i in 0..rows {
                for c in 0..head_rows {
                    let id = r * head_rows + c;
                    gathered.push(if id < vocab {
                        (id + 100 * i) as f32
                    } else {
                        -1.0
                    });
                }
            }
        }
        let mut out = vec![9.0; 3];
        assemble_logits(&gathered, rows, head_rows, vocab, &mut out);
        let want: Vec<f32> = (0..rows)
            .flat_map(|i| (0..vocab).map(move |id| (id + 100 * i) as f32))
            .collect();
        assert_eq!(out, want);
    }

    #[test]
    fn one_rank_gives_its_rows_back() {
        let gathered: Vec<f32> = (0..10).map(|x| x as f32).collect();
        let mut out = Vec::new();
        assemble_logits(&gathered, 2, 5, 5, &mut out);
        assert_eq!(out, gathered);
    }
}
