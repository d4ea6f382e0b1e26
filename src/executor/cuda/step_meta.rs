//! One CUDA step's integer metadata: everything the kernels read besides the weights, the KV
//! cache and the block tables (the sampling arguments and logit edits included), packed on the
//! host into one buffer (reused across steps) and uploaded with one copy.
//!
//! Per-sequence tables (`context_lens`, `q_start`, `q_len`) are indexed by the sequence's row in
//! the persistent batch (`SeqInput::row`), the same index as its row of the persistent device
//! block tables, so a kernel's "sequence" is a row and nothing needs re-packing when rows are not
//! all in the step. The block tables themselves stay on the device; a step carries only their
//! changed entries, scattered by `block_table_update` before the forward.
//!
//! Pure-decode steps are padded to a batch-size bucket and replayed from a CUDA graph: their
//! layout depends only on the bucket (`w = max_seqs + 1` rows, the last the table's spare row,
//! a padding row of context 1), so a graph's pointers stay valid and a replay needs only the
//! metadata copy before it.
//!
//! Verification steps (speculative decoding, `CudaBackendOptions::verify_graphs`, opt-in) are
//! replayed the same way when every sequence verifies the same number of drafts k: the layout
//! is a function of (bucket, k) (`graph_shape`). Each padding sequence is k + 1 tokens and one
//! flash tile over a padding row of context k + 1 (the device table's last row, which no
//! request ever takes, so it is all block 0), never written to the cache, its rows sampled from
//! the first padding sequence's. Mixed draft counts run eagerly: padding a sequence's own drafts
//! would change its context and query rows, which the kernels and `DeviceDraws` read.

use anyhow::ensure;

use super::kernels::{
    prefill_splits, DecodeSplitRule, SampleArgs, SampleEdit, PREFILL_TILE, SAMPLE_MAX_TOP,
};
use super::prefill_gemm::{GemmPlanner, GemmSeq};
use crate::sampling::params::SamplingParams;
use crate::step::BatchInput;

/// Batch sizes decode graphs are captured for; a step is padded up to the next one.
pub(super) const GRAPH_BUCKETS: &[usize] = &[
    1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512,
];

/// Offsets (in u32 words) of the metadata sections; a function of the step's counts only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Layout {
    pub tokens: usize,
    pub positions: usize,
    pub slots: usize,
    pub ctx: usize,
    pub q_start: usize,
    pub q_len: usize,
    pub dec_row: usize,
    pub dec_seq: usize,
    pub tile_seq: usize,
    pub tile_q0: usize,
    pub gemm_seq: usize,
    pub gemm_key0: usize,
    pub gemm_s0: usize,
    pub sample_rows: usize,
    /// `SampleArgs` of each sampled row (`ARG_WORDS` each, 8-byte aligned).
    pub args: usize,
    /// The sampled rows' `SampleEdit`s (two words each), `SampleArgs::edit_start` on.
    pub edits: usize,
    pub table_index: usize,
    pub table_value: usize,
    pub total: usize,
}

impl Layout {
    /// Sections for `t` tokens, `w` rows, `nd` decode items, `nt` flash tiles, `ng` GEMM-path
    /// sequences, `ns` sampled rows and their sampling arguments, `ne` logit edits, then `nu`
    /// block-table updates: last, because a captured graph never reads them and their count must
    /// not move what it reads. The edits' count varies from step to step under one graph too,
    /// so only what follows them moves with it.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        t: usize,
        w: usize,
        nd: usize,
        nt: usize,
        ng: usize,
        ns: usize,
        ne: usize,
        nu: usize,
    ) -> Self {
        let mut at = 0;
        let mut take = |n: usize| {
            let o = at;
            at += n;
            o
        };
        let mut l = Layout {
            tokens: take(t),
            positions: take(t),
            slots: take(t),
            ctx: take(w),
            q_start: take(w),
            q_len: take(w),
            dec_row: take(nd),
            dec_seq: take(nd),
            tile_seq: take(nt),
            tile_q0: take(nt),
            gemm_seq: take(ng),
            gemm_key0: take(ng),
            gemm_s0: take(ng),
            sample_rows: take(ns),
            args: 0,
            edits: 0,
            table_index: 0,
            table_value: 0,
            total: 0,
        };
        // The seeds are u64: the arguments start on an even word (the buffer is 256-aligned).
        at += at % 2;
        l.args = at;
        at += ns * ARG_WORDS;
        l.edits = at;
        at += ne * EDIT_WORDS;
        l.table_index = at;
        l.table_value = at + nu;
        l.total = at + 2 * nu;
        l
    }
}

/// u32 words of one `SampleArgs` in the metadata.
pub(super) const ARG_WORDS: usize = std::mem::size_of::<SampleArgs>() / 4;

/// u32 words of one `SampleEdit` in the metadata.
pub(super) const EDIT_WORDS: usize = std::mem::size_of::<SampleEdit>() / 4;

/// `a` as the words the sample kernel reads (little-endian, the C layout of `SampleArgs`).
fn arg_words(a: &SampleArgs) -> [u32; ARG_WORDS] {
    [
        a.seed as u32,
        (a.seed >> 32) as u32,
        a.output_index as u32,
        (a.output_index >> 32) as u32,
        a.temperature.to_bits(),
        a.top_p.to_bits(),
        a.min_p.to_bits(),
        a.top_k as u32,
        a.presence.to_bits(),
        a.frequency.to_bits(),
        a.repetition.to_bits(),
        a.counts_row as u32,
        a.edit_start as u32,
        a.num_edits as u32,
        a.num_logprobs as u32,
        a.pad as u32,
    ]
}

/// What packing needs to know of the backend.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub max_tokens: usize,
    pub max_seqs: usize,
    /// Most logit rows per step: one per sampling sequence, and one per draft (speculative
    /// decoding; `max_seqs` without).
    pub max_rows: usize,
    /// Blocks per device block-table row (its stride).
    pub max_blocks: usize,
    pub num_sms: u32,
    pub num_heads: usize,
    /// How decode attention splits its keys (`Limits::decode_splits`).
    pub decode: DecodeSplitRule,
    /// `CudaBackendOptions::prefill_split_kv`.
    pub prefill_split_kv: bool,
    pub gemm_max_len: usize,
    pub gemm_keys: usize,
    pub gemm_scores: usize,
    /// Capacity of the sampler's logit-edit buffer (entries, all rows).
    pub max_edits: usize,
}

impl Limits {
    /// Decode splits for `nd` items whose longest context is `max_context` keys, and whether
    /// they merge in a thread-block cluster (`DecodeSplitRule::splits`).
    pub fn decode_splits(&self, nd: usize, max_context: usize) -> (usize, bool) {
        self.decode.splits(nd, max_context)
    }
}

/// One step's shape; its metadata is in `HostMeta`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Step {
    pub t: usize,
    pub nd: usize,
    pub nt: usize,
    pub ns: usize,
    pub nu: usize,
    pub splits: usize,
    /// The decode splits merge in a thread-block cluster (`Limits::decode_splits`).
    pub decode_cluster: bool,
    /// Flash prefill attention's splits over the keys (1: none).
    pub prefill_splits: usize,
    pub layout: Layout,
}

/// Host buffers reused across steps (no allocation once they reached a step's size).
#[derive(Debug, Default)]
pub(super) struct HostMeta {
    pub meta: Vec<u32>,
    pub args: Vec<SampleArgs>,
    /// The sampled rows' logit edits (bias, min_tokens mask), `SampleArgs::edit_start` on.
    pub edits: Vec<SampleEdit>,
    /// Prefill sequences on the GEMM path, with their scratch offsets.
    pub gemm: Vec<GemmSeq>,
}

/// The bucket a pure-decode step is padded to for its CUDA graph, or None (graphs off, a step
/// with prefill, or none fits). The bucket covers the sequences and the rows they read.
pub(super) fn graph_bucket(batch: &BatchInput, graphs: bool, max_seqs: usize) -> Option<usize> {
    let pure_decode = batch
        .seqs
        .iter()
        .all(|q| q.query_len == 1 && q.sample.is_some());
    if !graphs || !pure_decode || batch.seqs.is_empty() {
        return None;
    }
    let rows = batch.seqs.iter().map(|q| q.row + 1).max().unwrap_or(0);
    let need = batch.seqs.len().max(rows);
    GRAPH_BUCKETS
        .iter()
        .copied()
        .find(|&b| b >= need && b <= max_seqs)
}

/// The shape a graph step is padded to: its batch-size bucket and the drafts every sequence
/// verifies (0: a pure-decode step). A graph's layout is a function of it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct GraphShape {
    pub bucket: usize,
    pub drafts: usize,
}

/// The graph shape of `batch`: a pure-decode step's bucket (`graph_bucket`), or with `verify`
/// a verification step's, when every sequence samples and verifies the same k > 0 drafts (one
/// flash tile each) and the padded step fits the token and row budgets; else None (eager).
pub(super) fn graph_shape(
    batch: &BatchInput,
    lim: &Limits,
    graphs: bool,
    verify: bool,
) -> Option<GraphShape> {
    if let Some(bucket) = graph_bucket(batch, graphs, lim.max_seqs) {
        return Some(GraphShape { bucket, drafts: 0 });
    }
    let k = batch.seqs.first()?.num_drafts;
    let uniform = batch
        .seqs
        .iter()
        .all(|q| q.num_drafts == k && q.query_len == k + 1 && q.sample.is_some());
    if !graphs || !verify || k == 0 || !uniform || k + 1 > PREFILL_TILE {
        return None;
    }
    let rows = batch.seqs.iter().map(|q| q.row + 1).max().unwrap_or(0);
    let need = batch.seqs.len().max(rows);
    let bucket = GRAPH_BUCKETS
        .iter()
        .copied()
        .find(|&b| b >= need && b <= lim.max_seqs)?;
    let padded = bucket * (k + 1);
    (padded <= lim.max_tokens && padded <= lim.max_rows).then_some(GraphShape { bucket, drafts: k })
}

/// Appends the logit edits of a row with `p` at output token `output_index` to `out`: the logit
/// bias, and -inf for the ids the min_tokens mask blocks; one entry per id (both sorted, so a
/// merge), as sample.cu requires.
pub(super) fn logit_edits(p: &SamplingParams, output_index: usize, out: &mut Vec<SampleEdit>) {
    let masked: &[u32] = match p.masks_stop_ids(output_index) {
        true => &p.min_tokens_blocked,
        false => &[],
    };
    let (mut b, mut m) = (p.logit_bias.iter().peekable(), masked.iter().peekable());
    loop {
        let e = match (b.peek(), m.peek()) {
            (None, None) => break,
            (Some(&&(t, v)), Some(&&mt)) if t < mt => {
                b.next();
                (t, v)
            }
            (Some(&&(t, _)), Some(&&mt)) if t == mt => {
                b.next();
                m.next();
                (t, f32::NEG_INFINITY)
            }
            (_, Some(&&mt)) => {
                m.next();
                (mt, f32::NEG_INFINITY)
            }
            (Some(&&(t, v)), None) => {
                b.next();
                (t, v)
            }
        };
        out.push(SampleEdit {
            token: e.0 as i32,
            value: e.1,
        });
    }
}

/// Packs `batch` (and the block-table `updates`, (index, block id) pairs) into `host`. With
/// `pad` (a graph shape) the step is padded so that its layout is the shape's: a decode bucket
/// b with dummy decodes (row b, context 1, no K/V write, greedy); a verification shape (b, k)
/// with dummy verifications (k + 1 tokens and one flash tile each, row `max_seqs`, context
/// k + 1, no K/V write, greedy), the real sequences all on flash tiles. `counts`: the device
/// holds token counts for the batch's rows (the persistent batch); without, penalties are
/// refused.
pub(super) fn pack(
    lim: &Limits,
    batch: &BatchInput,
    pad: Option<GraphShape>,
    updates: &[(u32, u32)],
    counts: bool,
    host: &mut HostMeta,
) -> anyhow::Result<Step> {
    let pad_to = pad.map(|g| g.bucket);
    // Tokens (and sampled rows) of one padding sequence; a verification graph's read no cached
    // prefix (the padding row) and take no GEMM-path scratch (planned on the host per step).
    let verify = pad.is_some_and(|g| g.drafts > 0);
    let per_pad = 1 + pad.map_or(0, |g| g.drafts);
    let real_s = batch.seqs.len();
    let s = pad_to.unwrap_or(real_s);
    ensure!(s >= real_s, "graph bucket {s} below {real_s} sequences");
    let pads = s - real_s;
    let t = batch.num_tokens() + pads * per_pad;
    ensure!(
        t <= lim.max_tokens,
        "step has {t} tokens; the CUDA backend was sized for {}",
        lim.max_tokens
    );
    ensure!(
        s <= lim.max_seqs,
        "step has {s} sequences; the CUDA backend was sized for {}",
        lim.max_seqs
    );
    let rows = batch.seqs.iter().map(|q| q.row + 1).max().unwrap_or(0);
    ensure!(
        rows <= lim.max_seqs,
        "step reads block-table row {}; the CUDA backend has {} rows",
        rows - 1,
        lim.max_seqs
    );
    // The padding row of a graph step is the table's spare last row: no request ever takes it,
    // so every entry is block 0. (Row `bucket` could be a live request outside this step, whose
    // first entries are NULL_BLOCK once a sliding window has freed them.)
    let pad_row = lim.max_seqs;
    let w = pad_to.map_or(rows, |_| pad_row + 1);
    ensure!(w >= rows, "bucket {w} does not cover row {rows}");
    // Prefill sequences go to the GEMM path while they are short enough and its scratch lasts;
    // the flash kernel's tiles cover the rest.
    let mut planner = GemmPlanner::new(
        lim.gemm_max_len,
        lim.num_heads,
        lim.gemm_keys,
        lim.gemm_scores,
    );
    host.gemm.clear();
    let (mut nd, mut nt) = match verify {
        true => (0, pads),
        false => (pads, 0),
    };
    let (mut row0, mut max_context) = (0, 1);
    let mut flash_context = if verify && pads > 0 { per_pad } else { 0 };
    for q in &batch.seqs {
        ensure!(
            batch.block_table(q).len() <= lim.max_blocks,
            "{}: {} blocks; max_model_len allows {}",
            q.request_id,
            batch.block_table(q).len(),
            lim.max_blocks
        );
        if q.query_len == 1 {
            nd += 1;
        } else {
            let gemm = match verify {
                true => None,
                false => planner.place(q.row, row0, q.query_len, q.context_len),
            };
            match gemm {
                Some(g) => host.gemm.push(g),
                None => {
                    nt += q.query_len.div_ceil(PREFILL_TILE);
                    flash_context = flash_context.max(q.context_len);
                }
            }
        }
        row0 += q.query_len;
        max_context = max_context.max(q.context_len);
    }
    let ns = batch.num_logit_rows() + pads * per_pad;
    ensure!(
        ns <= lim.max_rows,
        "step samples {ns} rows; the CUDA backend was sized for {} (max_drafts too small?)",
        lim.max_rows
    );
    // The edits' count is known once the rows are packed; nothing before them depends on it.
    let mut layout = Layout::new(t, w, nd, nt, host.gemm.len(), ns, 0, updates.len());
    let meta = &mut host.meta;
    meta.clear();
    meta.resize(layout.total, 0);
    host.args.clear();
    host.edits.clear();
    let n = batch.num_tokens();
    meta[layout.tokens..layout.tokens + n].copy_from_slice(&batch.token_ids);
    meta[layout.positions..layout.positions + n].copy_from_slice(&batch.positions);
    meta[layout.slots..layout.slots + n].copy_from_slice(&batch.slot_mapping);
    let (mut dec, mut tile, mut samp, mut start, mut next_gemm) = (0, 0, 0, 0, 0);
    for q in &batch.seqs {
        let r = q.row;
        meta[layout.ctx + r] = q.context_len as u32;
        meta[layout.q_start + r] = start as u32;
        meta[layout.q_len + r] = q.query_len as u32;
        if q.query_len == 1 {
            meta[layout.dec_row + dec] = start as u32;
            meta[layout.dec_seq + dec] = r as u32;
            dec += 1;
        } else if host.gemm.get(next_gemm).is_some_and(|g| g.seq == r) {
            next_gemm += 1;
        } else {
            for q0 in (0..q.query_len).step_by(PREFILL_TILE) {
                meta[layout.tile_seq + tile] = r as u32;
                meta[layout.tile_q0 + tile] = q0 as u32;
                tile += 1;
            }
        }
        // A sequence with drafts samples each of its last `num_drafts + 1` rows at its own
        // output index: the draws that verify the drafts (`executor::verify::DeviceDraws`).
        for j in (0..=q.num_drafts).filter(|_| q.sample.is_some()) {
            let smp = q.sample.as_ref().expect("filtered");
            let row = start + q.query_len - 1 - q.num_drafts + j;
            meta[layout.sample_rows + samp] = row as u32;
            samp += 1;
            let p = &smp.params;
            ensure!(
                counts || !p.has_penalties(),
                "{}: penalties need the persistent batch's token counts",
                q.request_id
            );
            // Token counts are bumped once per step: a verification's rows would need them per
            // position (the scheduler never gives such a request drafts).
            ensure!(
                q.num_drafts == 0 || !p.has_penalties(),
                "{}: drafts for a request with penalties",
                q.request_id
            );
            let output_index = smp.output_index + j;
            let edit_start = host.edits.len();
            logit_edits(p, output_index, &mut host.edits);
            host.args.push(SampleArgs {
                seed: smp.seed,
                output_index: output_index as u64,
                temperature: p.temperature,
                top_p: p.top_p,
                min_p: p.min_p,
                top_k: p.top_k.min(i32::MAX as usize) as i32,
                presence: p.presence_penalty,
                frequency: p.frequency_penalty,
                repetition: p.repetition_penalty,
                counts_row: if p.has_penalties() { r as i32 } else { -1 },
                edit_start: edit_start as i32,
                num_edits: (host.edits.len() - edit_start) as i32,
                num_logprobs: p.logprobs.unwrap_or(0).min(SAMPLE_MAX_TOP) as i32,
                pad: 0,
            });
        }
        start += q.query_len;
    }
    for (k, g) in host.gemm.iter().enumerate() {
        meta[layout.gemm_seq + k] = g.seq as u32;
        meta[layout.gemm_key0 + k] = g.key0 as u32;
        meta[layout.gemm_s0 + k] = g.s0 as u32;
    }
    // Padding: one dummy token per dummy sequence, at position 0, never written (slot
    // u32::MAX), reading block 0 of the padding row (the spare row: always block 0).
    if pad_to.is_some() && pads > 0 && !verify {
        meta[layout.ctx + pad_row] = 1;
        meta[layout.q_start + pad_row] = start as u32;
        meta[layout.q_len + pad_row] = 1;
        for row in start..start + pads {
            meta[layout.slots + row] = u32::MAX;
            meta[layout.dec_row + dec] = row as u32;
            meta[layout.dec_seq + dec] = pad_row as u32;
            dec += 1;
            meta[layout.sample_rows + samp] = row as u32;
            samp += 1;
            host.args.push(SampleArgs::default());
        }
    }
    if verify && pads > 0 {
        pad_verifications(&layout, meta, start, pads, per_pad, pad_row, tile, samp);
        host.args
            .extend(std::iter::repeat_n(SampleArgs::default(), pads * per_pad));
    }
    ensure!(
        host.edits.len() <= lim.max_edits,
        "step has {} logit edits; the CUDA sampler was sized for {}",
        host.edits.len(),
        lim.max_edits
    );
    layout = Layout::new(
        t,
        w,
        nd,
        nt,
        host.gemm.len(),
        ns,
        host.edits.len(),
        updates.len(),
    );
    meta.resize(layout.total, 0);
    for (k, a) in host.args.iter().enumerate() {
        let at = layout.args + k * ARG_WORDS;
        meta[at..at + ARG_WORDS].copy_from_slice(&arg_words(a));
    }
    for (k, e) in host.edits.iter().enumerate() {
        let at = layout.edits + k * EDIT_WORDS;
        meta[at..at + EDIT_WORDS].copy_from_slice(&[e.token as u32, e.value.to_bits()]);
    }
    for (k, &(index, value)) in updates.iter().enumerate() {
        meta[layout.table_index + k] = index;
        meta[layout.table_value + k] = value;
    }
    // The kernel derives each split's length from the context at run time, so a graph captured
    // for a split count serves every context; graphs are keyed by it.
    let (splits, decode_cluster) = lim.decode_splits(nd, max_context);
    let prefill_splits = match lim.prefill_split_kv && nt > 0 {
        true => prefill_splits(lim.num_sms, nt, lim.num_heads, flash_context),
        false => 1,
    };
    Ok(Step {
        t,
        nd,
        nt,
        ns,
        nu: updates.len(),
        splits,
        decode_cluster,
        prefill_splits,
        layout,
    })
}

/// A verification graph's padding: `pads` dummy sequences of `per_pad` tokens from token row
/// `start` (positions 0.., never written: slot u32::MAX), each one flash tile over `pad_row`
/// (context `per_pad`, its queries the first dummy's rows: the tiles compute the same rows, and
/// the other dummies' rows are never attended nor sampled), each sampling the first dummy's
/// rows (`SampleArgs::default()`: greedy), after `tile` real tiles and `samp` sampled rows.
#[allow(clippy::too_many_arguments)]
fn pad_verifications(
    l: &Layout,
    meta: &mut [u32],
    start: usize,
    pads: usize,
    per_pad: usize,
    pad_row: usize,
    tile: usize,
    samp: usize,
) {
    meta[l.ctx + pad_row] = per_pad as u32;
    meta[l.q_start + pad_row] = start as u32;
    meta[l.q_len + pad_row] = per_pad as u32;
    for i in 0..pads {
        for j in 0..per_pad {
            let row = start + i * per_pad + j;
            meta[l.positions + row] = j as u32;
            meta[l.slots + row] = u32::MAX;
            meta[l.sample_rows + samp + i * per_pad + j] = (start + j) as u32;
        }
        meta[l.tile_seq + tile + i] = pad_row as u32;
        meta[l.tile_q0 + tile + i] = 0;
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod verify_tests;
