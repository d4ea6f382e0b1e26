//! The executor's persistent input batch (vLLM v1's `InputBatch`): one row per request the
//! executor holds, with its tokens so far, sampling state and block table. Each step applies the
//! scheduler's diffs (`SchedulerOutput`: drops, new requests, tokens scheduled, appended blocks)
//! and builds the flat `BatchInput` the forward runs, reusing its buffers; after the forward the
//! tokens the executor sampled are appended to their rows (`record`), so the scheduler never
//! sends them back.
//!
//! Rows stay dense (0..len): a dropped row takes the last one's place. Block tables are only
//! rewritten for new rows and moved rows and otherwise appended to, except under a sliding
//! window, where leading entries become `NULL_BLOCK` as the scheduler reports them freed
//! (`ScheduledRequest::num_freed_blocks`); `drain_table_changes` hands the changed entries to a
//! backend that mirrors the tables on a device.
//!
//! Every diff is checked against what the executor holds; a mismatch is an error naming the
//! request (a scheduler bug), never silently wrong K/V.
//!
//! Speculative decoding splits a step in two: `apply` takes the diffs (a KV rollback cuts a
//! row's table first: `truncate_blocks_to`), the proposer reads the requests with draft
//! positions (`propose_requests`), and `build` lays out each one's known token followed by its
//! drafts. Drafts are never appended to a row: `record` appends what was verified, and the
//! next step's `sample` trims whatever the scheduler did not keep.
//!
//! Requests with penalties need their token counts at every sampling step. They are kept
//! incrementally, never rebuilt per step: on the host (`TokenCounts` in the row, updated as
//! tokens are recorded or trimmed) for the CPU backend, or, for a backend that keeps them on its
//! device (`track_counts_on_device`), as a log of [`CountOp`]s — row moved, row cleared, counts
//! changed — that it drains each step (the sampling kernel itself counts what it samples).
//!
//! Past 600 lines (with speculation's apply/build split and the penalty counts) on purpose:
//! every check on a row's tokens, table and counts lives next to the one state they guard;
//! splitting it would spread those invariants over files.

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

use anyhow::{bail, ensure};

use crate::request::RequestId;
use crate::sampling::params::SamplingParams;
use crate::sampling::sampler::TokenCounts;
use crate::spec::{Proposal, ProposeRequest};
use crate::step::{
    BatchInput, BlockTables, SampleInput, SchedulerOutput, SeqInput, StepOutput, NULL_BLOCK,
};

/// `changed_from` of a row whose table is in sync.
const CLEAN: usize = usize::MAX;

#[derive(Debug)]
struct Row {
    id: RequestId,
    /// Prompt, then the output so far (what the scheduler knows, plus at most the tokens
    /// sampled in the last step, which it may not have kept).
    tokens: Vec<u32>,
    num_prompt: usize,
    params: Arc<SamplingParams>,
    seed: u64,
    /// Host-kept counts of a request with penalties (CPU backend); None otherwise.
    counts: Option<TokenCounts>,
    /// Leading block-table entries freed behind the sliding window (`NULL_BLOCK`).
    num_freed: usize,
}

/// One scheduled request of the step being built, as `apply` checked it.
#[derive(Debug, Clone, Copy)]
struct Planned {
    row: usize,
    computed: usize,
    n: usize,
    sample: bool,
    /// Draft positions reserved after the known tokens.
    max_drafts: usize,
}

/// A change to the device-kept token counts of requests with penalties, in the order they must
/// be applied (`InputBatch::drain_count_ops`). A row's counts hold, per token id, its
/// occurrences in the output and whether the prompt holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountOp {
    /// Row `to` takes row `from`'s counts (a dropped row's place is taken by the last one).
    Move { from: usize, to: usize },
    /// Row `row` starts from nothing (a new request).
    Clear { row: usize },
    /// `token` is in the prompt of the request in `row`.
    Prompt { row: usize, token: u32 },
    /// `token`'s output count in `row` changes by `delta`.
    Add { row: usize, token: u32, delta: i32 },
}

#[derive(Debug)]
pub struct InputBatch {
    block_size: usize,
    num_kv_blocks: usize,
    max_blocks_per_seq: usize,
    /// The model's attention window (None: full attention), against which freed blocks are
    /// checked: a query must never see one.
    sliding_window: Option<usize>,
    rows: Vec<Row>,
    index: HashMap<RequestId, usize>,
    /// The flat batch of the last step; its `block_tables` are the persistent tables.
    batch: BatchInput,
    /// Per row, the last step (`steps`) that scheduled it: a request twice in a step is an error.
    scheduled_in: Vec<u64>,
    steps: u64,
    /// Whether changes are recorded for `drain_table_changes` (a backend mirroring the tables).
    track_changes: bool,
    /// Per row: the first block-table column changed since the last drain (`CLEAN`: none).
    /// Entries from there to the row's end are sent.
    changed_from: Vec<usize>,
    /// Per row: the first column nulled since the last drain (`CLEAN`: none). Entries from there
    /// to the row's `num_freed` are sent (up to `changed_from`, which covers the rest).
    nulled_from: Vec<usize>,
    changed_rows: Vec<usize>,
    /// The step `apply` took, for `build`.
    planned: Vec<Planned>,
    /// Whether the counts of requests with penalties are kept on a device (`count_ops`) rather
    /// than in the rows.
    counts_on_device: bool,
    count_ops: Vec<CountOp>,
}

impl InputBatch {
    /// Rows hold up to `max_blocks_per_seq` blocks (the longest sequence) of ids below
    /// `num_kv_blocks`.
    pub fn new(block_size: usize, num_kv_blocks: usize, max_blocks_per_seq: usize) -> Self {
        InputBatch {
            block_size,
            num_kv_blocks,
            max_blocks_per_seq,
            sliding_window: None,
            rows: Vec::new(),
            index: HashMap::new(),
            batch: BatchInput {
                block_tables: BlockTables::with_width(max_blocks_per_seq),
                ..BatchInput::default()
            },
            scheduled_in: Vec::new(),
            steps: 0,
            track_changes: false,
            changed_from: Vec::new(),
            nulled_from: Vec::new(),
            changed_rows: Vec::new(),
            planned: Vec::new(),
            counts_on_device: false,
            count_ops: Vec::new(),
        }
    }

    /// The token counts of requests with penalties are kept by the owner's device, from the
    /// ops it drains every step (`drain_count_ops`); the device counts each token it samples.
    pub fn track_counts_on_device(mut self) -> Self {
        self.counts_on_device = true;
        self
    }

    /// The host-kept counts of the request in `row` (CPU backend; None without penalties).
    pub fn counts(&self, row: usize) -> Option<&TokenCounts> {
        self.rows.get(row).and_then(|r| r.counts.as_ref())
    }

    /// Calls `f` for every count change since the last drain, in order.
    pub fn drain_count_ops(&mut self, mut f: impl FnMut(CountOp)) {
        for op in self.count_ops.drain(..) {
            f(op);
        }
    }

    /// Every row with penalties is counted again from its tokens (its device counts were lost,
    /// e.g. by a failed step); replaces the ops not drained yet.
    pub fn recount_all(&mut self) {
        self.count_ops.clear();
        for r in 0..self.rows.len() {
            self.count_row(r);
        }
    }

    /// Device counts of row `r` from scratch: cleared, prompt ids, output tokens.
    fn count_row(&mut self, r: usize) {
        let row = &self.rows[r];
        if !self.counts_on_device || !row.params.has_penalties() {
            return;
        }
        let ops = &mut self.count_ops;
        ops.push(CountOp::Clear { row: r });
        let (prompt, output) = row.tokens.split_at(row.num_prompt);
        ops.extend(
            prompt
                .iter()
                .map(|&token| CountOp::Prompt { row: r, token }),
        );
        ops.extend(output.iter().map(|&token| CountOp::Add {
            row: r,
            token,
            delta: 1,
        }));
    }

    /// The model attends to its last `window` positions only (None: all of them), so the
    /// scheduler may free blocks behind it.
    pub fn with_sliding_window(mut self, window: Option<usize>) -> Self {
        self.sliding_window = window;
        self
    }

    /// Records block-table changes for `drain_table_changes`, which the owner must then call
    /// every step (a backend that mirrors the tables on a device).
    pub fn track_table_changes(mut self) -> Self {
        self.track_changes = true;
        self
    }

    /// Requests held (rows in use).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.index.contains_key(&id)
    }

    /// The tokens held for `id`.
    pub fn tokens(&self, id: RequestId) -> Option<&[u32]> {
        self.index.get(&id).map(|&r| self.rows[r].tokens.as_slice())
    }

    /// The flat batch built by the last `update`.
    pub fn batch(&self) -> &BatchInput {
        &self.batch
    }

    /// Applies `step` (drops first, then each scheduled request's state or diff) and builds the
    /// flat batch, in the step's order, without drafts. The batch satisfies
    /// `BatchInput::validate` by construction (every diff is checked here). On an error it is
    /// unusable for this step.
    pub fn update(&mut self, step: &SchedulerOutput) -> anyhow::Result<&BatchInput> {
        self.apply(step)?;
        self.build(&[])
    }

    /// Applies `step`'s diffs (drops first, then each scheduled request's state, table cut,
    /// appended and freed blocks) and checks what each request computes; `build` lays the
    /// batch out. The drops are applied before anything can fail.
    pub fn apply(&mut self, step: &SchedulerOutput) -> anyhow::Result<()> {
        self.steps += 1;
        self.planned.clear();
        for &id in step.finished_req_ids.iter().chain(&step.preempted) {
            self.remove(id);
        }
        for s in &step.scheduled {
            let row = match &s.new {
                Some(new) => {
                    ensure!(
                        !self.index.contains_key(&s.id),
                        "{}: sent as new, but the executor holds it",
                        s.id
                    );
                    ensure!(
                        new.num_prompt_tokens <= new.token_ids.len(),
                        "{}: {} prompt tokens of {}",
                        s.id,
                        new.num_prompt_tokens,
                        new.token_ids.len()
                    );
                    let r = self.rows.len();
                    let (prompt, output) = new.token_ids.split_at(new.num_prompt_tokens);
                    let host_counts = !self.counts_on_device && new.params.has_penalties();
                    self.rows.push(Row {
                        id: s.id,
                        tokens: new.token_ids.clone(),
                        num_prompt: new.num_prompt_tokens,
                        params: new.params.clone(),
                        seed: new.seed,
                        counts: host_counts.then(|| TokenCounts::new(prompt, output)),
                        num_freed: 0,
                    });
                    self.index.insert(s.id, r);
                    self.count_row(r);
                    self.batch.block_tables.set_row(r, &[]);
                    r
                }
                None => match self.index.get(&s.id) {
                    Some(&r) => r,
                    None => bail!(
                        "{}: scheduled, but the executor holds no state for it",
                        s.id
                    ),
                },
            };
            if let Some(n) = s.truncate_blocks_to {
                self.cut_blocks(row, s.id, n)?;
            }
            self.append_blocks(row, s.id, &s.new_block_ids, s.num_freed_blocks)?;
            self.free_leading(row, s.id, s.num_freed_blocks)?;
            self.plan_seq(
                row,
                s.num_computed_tokens,
                s.num_tokens,
                s.sample,
                s.num_draft_tokens,
            )?;
        }
        Ok(())
    }

    /// The requests of the applied step that have draft positions, in step order: what the
    /// proposer proposes for.
    pub fn propose_requests(&self) -> Vec<ProposeRequest<'_>> {
        self.planned
            .iter()
            .filter(|p| p.max_drafts > 0)
            .map(|p| {
                let row = &self.rows[p.row];
                let end = p.computed + p.n;
                ProposeRequest {
                    id: row.id,
                    tokens: &row.tokens[..end],
                    block_table: self.batch.block_tables.row(p.row),
                    max_drafts: p.max_drafts,
                    params: &row.params,
                    seed: row.seed,
                    output_index: end - row.num_prompt,
                }
            })
            .collect()
    }

    /// Lays out the applied step as the flat batch: each request's known tokens, then, for
    /// those with draft positions, the drafts in `drafts` (one proposal per request of
    /// `propose_requests`, in its order; empty: no drafts at all).
    pub fn build(&mut self, drafts: &[Proposal]) -> anyhow::Result<&BatchInput> {
        let with_drafts = self.planned.iter().filter(|p| p.max_drafts > 0).count();
        ensure!(
            drafts.is_empty() || drafts.len() == with_drafts,
            "{} proposals for {with_drafts} requests with draft positions",
            drafts.len()
        );
        let b = &mut self.batch;
        b.token_ids.clear();
        b.positions.clear();
        b.slot_mapping.clear();
        b.seqs.clear();
        let mut next = drafts.iter();
        let bs = self.block_size;
        for p in &self.planned {
            let row = &self.rows[p.row];
            let proposed: &[u32] = match p.max_drafts {
                0 => &[],
                _ => next.next().map_or(&[], |d| &d.tokens),
            };
            ensure!(
                proposed.len() <= p.max_drafts,
                "{}: {} drafts for {} draft positions",
                row.id,
                proposed.len(),
                p.max_drafts
            );
            let end = p.computed + p.n;
            let table = b.block_tables.row(p.row);
            b.token_ids.extend_from_slice(&row.tokens[p.computed..end]);
            b.token_ids.extend_from_slice(proposed);
            for pos in p.computed..end + proposed.len() {
                b.positions.push(pos as u32);
                b.slot_mapping
                    .push(table[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            b.seqs.push(SeqInput {
                request_id: row.id,
                row: p.row,
                query_len: p.n + proposed.len(),
                context_len: end + proposed.len(),
                sample: p.sample.then(|| SampleInput {
                    params: row.params.clone(),
                    seed: row.seed,
                    output_index: end - row.num_prompt,
                }),
                num_drafts: proposed.len(),
            });
        }
        Ok(&self.batch)
    }

    /// Appends the step's sampled tokens to their rows.
    pub fn record(&mut self, out: &StepOutput) -> anyhow::Result<()> {
        for s in &out.sampled {
            let Some(&r) = self.index.get(&s.request_id) else {
                bail!(
                    "{}: sampled, but the executor holds no state for it",
                    s.request_id
                );
            };
            let row = &mut self.rows[r];
            row.tokens.push(s.token);
            if let Some(c) = &mut row.counts {
                c.push_output(s.token);
            }
        }
        Ok(())
    }

    /// Calls `f(row, column, block id)` for every block-table entry changed since the last
    /// drain, then treats the tables as in sync.
    pub fn drain_table_changes(&mut self, mut f: impl FnMut(usize, usize, u32)) {
        for r in self.changed_rows.drain(..) {
            if r < self.rows.len() {
                let row = self.batch.block_tables.row(r);
                let from = self.changed_from[r];
                let nulled = self.nulled_from[r]..self.rows[r].num_freed.min(from);
                for c in nulled {
                    f(r, c, row[c]);
                }
                for (c, &id) in row.iter().enumerate().skip(from) {
                    f(r, c, id);
                }
            }
            self.changed_from[r] = CLEAN;
            self.nulled_from[r] = CLEAN;
        }
    }

    /// Every held row's whole table counts as changed (its mirror was overwritten).
    pub fn mark_all_changed(&mut self) {
        for r in 0..self.rows.len() {
            self.mark_changed(r, 0);
        }
    }

    fn mark_changed(&mut self, r: usize, from: usize) {
        if self.touch(r) {
            self.changed_from[r] = self.changed_from[r].min(from);
        }
    }

    fn mark_nulled(&mut self, r: usize, from: usize) {
        if self.touch(r) {
            self.nulled_from[r] = self.nulled_from[r].min(from);
        }
    }

    /// Lists row `r` among the changed ones; false when changes are not tracked.
    fn touch(&mut self, r: usize) -> bool {
        if !self.track_changes {
            return false;
        }
        if self.changed_from.len() <= r {
            self.changed_from.resize(r + 1, CLEAN);
            self.nulled_from.resize(r + 1, CLEAN);
        }
        if self.changed_from[r] == CLEAN && self.nulled_from[r] == CLEAN {
            self.changed_rows.push(r);
        }
        true
    }

    /// Drops `id`'s row (unknown ids are a no-op); the last row moves into its place.
    fn remove(&mut self, id: RequestId) {
        let Some(r) = self.index.remove(&id) else {
            return;
        };
        let last = self.rows.len() - 1;
        self.rows.swap_remove(r);
        if r != last {
            self.batch.block_tables.copy_row(last, r);
            self.index.insert(self.rows[r].id, r);
            self.mark_changed(r, 0);
            if self.counts_on_device && self.rows[r].params.has_penalties() {
                self.count_ops.push(CountOp::Move { from: last, to: r });
            }
        }
        self.batch.block_tables.truncate(last);
        if let Some(c) = self.changed_from.get_mut(last) {
            *c = CLEAN;
            self.nulled_from[last] = CLEAN;
        }
    }

    /// Appends `blocks` to row `r`; a `NULL_BLOCK` among them must fall below `num_freed` (the
    /// step's count of freed leading entries).
    fn append_blocks(
        &mut self,
        r: usize,
        id: RequestId,
        blocks: &[u32],
        num_freed: usize,
    ) -> anyhow::Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let have = self.batch.block_tables.row(r).len();
        for (c, &b) in (have..).zip(blocks) {
            if b == NULL_BLOCK {
                ensure!(
                    c < num_freed,
                    "{id}: freed block at column {c}, past its {num_freed} freed blocks"
                );
            } else if b as usize >= self.num_kv_blocks {
                bail!(
                    "{id}: block {b} is outside the pool of {}",
                    self.num_kv_blocks
                );
            } else {
                ensure!(
                    c >= num_freed,
                    "{id}: block {b} at column {c}, among its {num_freed} freed blocks"
                );
            }
        }
        ensure!(
            have + blocks.len() <= self.max_blocks_per_seq,
            "{id}: {} blocks exceed the longest sequence ({} blocks)",
            have + blocks.len(),
            self.max_blocks_per_seq
        );
        self.batch.block_tables.append(r, blocks);
        self.mark_changed(r, have);
        Ok(())
    }

    /// Row `r`'s first `num_freed` entries become `NULL_BLOCK` (the KV manager freed them behind
    /// the sliding window). Freed entries only ever grow, and lie within the table.
    fn free_leading(&mut self, r: usize, id: RequestId, num_freed: usize) -> anyhow::Result<()> {
        let had = self.rows[r].num_freed;
        if num_freed == had {
            return Ok(());
        }
        ensure!(
            num_freed > had,
            "{id}: {num_freed} freed blocks, but {had} were freed before"
        );
        let len = self.batch.block_tables.row(r).len();
        ensure!(
            num_freed <= len,
            "{id}: {num_freed} freed blocks of a table of {len}"
        );
        self.batch.block_tables.fill(r, had..num_freed, NULL_BLOCK);
        self.rows[r].num_freed = num_freed;
        self.mark_nulled(r, had);
        Ok(())
    }

    /// Row `r`'s table is cut to `n` entries (blocks released after rejected drafts).
    fn cut_blocks(&mut self, r: usize, id: RequestId, n: usize) -> anyhow::Result<()> {
        let len = self.batch.block_tables.row(r).len();
        ensure!(
            n <= len && n >= self.rows[r].num_freed,
            "{id}: table cut to {n} entries, but it has {len} ({} freed)",
            self.rows[r].num_freed
        );
        self.batch.block_tables.truncate_row(r, n);
        Ok(())
    }

    /// Checks that row `r` can compute tokens `computed..computed + n` (and `max_drafts` draft
    /// positions after them) and records it for `build`.
    fn plan_seq(
        &mut self,
        r: usize,
        computed: usize,
        n: usize,
        sample: bool,
        max_drafts: usize,
    ) -> anyhow::Result<()> {
        let bs = self.block_size;
        let row = &mut self.rows[r];
        let end = computed + n;
        ensure!(n > 0, "{}: scheduled with no tokens", row.id);
        ensure!(
            max_drafts == 0 || (n == 1 && sample),
            "{}: {max_drafts} draft positions off a decode ({n} tokens, sample: {sample})",
            row.id
        );
        // Verification samples the plain distribution per position (`SamplingParams::
        // may_speculate`): penalties, bias, min_tokens and logprobs never get drafts.
        ensure!(
            max_drafts == 0 || row.params.may_speculate(),
            "{}: {max_drafts} draft positions for a request that may not speculate",
            row.id
        );
        if self.scheduled_in.len() <= r {
            self.scheduled_in.resize(r + 1, 0);
        }
        ensure!(
            self.scheduled_in[r] != self.steps,
            "{}: scheduled twice in one step",
            row.id
        );
        self.scheduled_in[r] = self.steps;
        // Sampling ends the known tokens: any the executor appended beyond were not kept.
        if sample && row.tokens.len() > end {
            let from = end.max(row.num_prompt);
            for &token in &row.tokens[from..] {
                if let Some(c) = &mut row.counts {
                    c.pop_output(token);
                } else if self.counts_on_device && row.params.has_penalties() {
                    self.count_ops.push(CountOp::Add {
                        row: r,
                        token,
                        delta: -1,
                    });
                }
            }
            row.tokens.truncate(end);
        }
        ensure!(
            row.tokens.len() >= end && (sample || row.tokens.len() > end),
            "{}: tokens {computed}..{end} scheduled (sample: {sample}), the executor holds {}",
            row.id,
            row.tokens.len()
        );
        // Every key the first query sees (and so every key of the step) lies past the freed
        // blocks; then no token is written into one either.
        match self.sliding_window {
            None => ensure!(
                row.num_freed == 0,
                "{}: {} freed blocks under full attention",
                row.id,
                row.num_freed
            ),
            Some(w) => {
                let visible_from = (computed + 1).saturating_sub(w);
                ensure!(
                    row.num_freed * bs <= visible_from,
                    "{}: {} freed blocks, but the attention window of position {computed} starts at {visible_from}",
                    row.id,
                    row.num_freed
                );
            }
        }
        let table = self.batch.block_tables.row(r);
        ensure!(
            table.len() * bs >= end + max_drafts,
            "{}: {} blocks do not cover {end} tokens and {max_drafts} draft positions",
            row.id,
            table.len()
        );
        self.planned.push(Planned {
            row: r,
            computed,
            n,
            sample,
            max_drafts,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests;
