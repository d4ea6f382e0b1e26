//! The scheduler tests' harness: a fake model behind a fake executor, the plain reference
//! decode, and `Engine` (scheduler + KV manager + fake executor, checking invariants around
//! every step).
//!
//! The fake executor takes the step as a real one does: through an `InputBatch` (the diffs
//! applied to its persistent rows, its own sampled tokens appended), and it reads K/V through
//! block tables mirrored the way the CUDA backend mirrors them on the device (only the drained
//! changes applied), so a lost diff or a missed table change shows up as wrong output.
//!
//! With a sliding window the fake model reads only the last `window` positions (and so does
//! the reference); the KV manager frees blocks behind it, and a read of a freed block fails.

use super::*;
use crate::executor::input_batch::InputBatch;
use crate::sampling::sampler::sample_seed;
use crate::step::{BlockCopy, CopyKind, SampledToken, NULL_BLOCK};

/// The positions a query at `pos` reads: all before it, or the last `window`.
pub(super) fn visible(pos: usize, window: Option<usize>) -> std::ops::Range<usize> {
    (pos + 1).saturating_sub(window.unwrap_or(usize::MAX))..pos + 1
}

/// The fake model's next token after `context`: never a reserved id.
pub(super) fn next_token(context: &[u32]) -> u32 {
    let mut h = DefaultHasher::new();
    context.hash(&mut h);
    RESERVED + (h.finish() % (VOCAB - RESERVED) as u64) as u32
}

/// Scripted tokens: (request, output index) → token, overriding the model.
pub(super) type Script = HashMap<(RequestId, usize), u32>;

pub(super) struct FakeModel {
    pub(super) num_blocks: usize,
    /// Token id whose K/V each slot holds.
    pub(super) slots: Vec<Option<u32>>,
    /// The host tier's slots, likewise (grown on demand).
    pub(super) host_slots: Vec<Option<u32>>,
    pub(super) script: Script,
    /// Sliding window in positions (None: full attention).
    pub(super) window: Option<usize>,
    pub(super) input: InputBatch,
    /// Block tables by row as a device mirror holds them: only drained changes applied.
    pub(super) mirror: Vec<Vec<u32>>,
}

impl FakeModel {
    pub(super) fn new(num_blocks: usize, window: Option<usize>) -> Self {
        FakeModel {
            num_blocks,
            slots: vec![None; num_blocks * BLOCK_SIZE],
            host_slots: Vec::new(),
            script: Script::new(),
            window,
            input: InputBatch::new(BLOCK_SIZE, num_blocks, num_blocks)
                .with_sliding_window(window)
                .track_table_changes(),
            mirror: Vec::new(),
        }
    }

    /// Runs sequences one at a time, last first, each writing its K/V and then reading its
    /// context: a same-step read of another sequence's blocks would see stale K/V. An empty
    /// step is not the executor's (the actor does not send it).
    pub(super) fn execute(&mut self, out: &SchedulerOutput) -> StepOutput {
        if out.is_empty() {
            return StepOutput::default();
        }
        self.input.update(out).unwrap();
        // The copies the forward waits for land before it, the rest (worst case) after it:
        // a forward that touched a block of an overlapped copy would compute wrong tokens.
        let (needed, overlapped) = out.kv_copies.split_at(out.kv_copies_for_forward);
        self.copy_blocks(needed);
        let mirror = &mut self.mirror;
        self.input.drain_table_changes(|r, c, id| {
            if mirror.len() <= r {
                mirror.resize(r + 1, Vec::new());
            }
            if mirror[r].len() <= c {
                mirror[r].resize(c + 1, u32::MAX);
            }
            mirror[r][c] = id;
        });
        let batch = self.input.batch();
        for s in &batch.seqs {
            let host = batch.block_table(s);
            assert_eq!(
                &self.mirror[s.row][..host.len()],
                host,
                "mirror of row {}",
                s.row
            );
        }
        batch.validate(BLOCK_SIZE, self.num_blocks).unwrap();
        batch.validate_window(BLOCK_SIZE, self.window).unwrap();
        let mut starts = Vec::with_capacity(batch.seqs.len());
        let mut start = 0;
        for s in &batch.seqs {
            starts.push(start);
            start += s.query_len;
        }
        let mut sampled = Vec::new();
        for (s, &start) in batch.seqs.iter().zip(&starts).rev() {
            for i in start..start + s.query_len {
                self.slots[batch.slot_mapping[i] as usize] = Some(batch.token_ids[i]);
            }
            let Some(sample) = &s.sample else { continue };
            let table = &self.mirror[s.row];
            let context: Vec<u32> = visible(s.context_len - 1, self.window)
                .map(|p| {
                    let block = table[p / BLOCK_SIZE];
                    assert_ne!(block, NULL_BLOCK, "attention read a freed block");
                    let slot = block as usize * BLOCK_SIZE + p % BLOCK_SIZE;
                    self.slots[slot].expect("attention read an unwritten slot")
                })
                .collect();
            let token = self
                .script
                .get(&(s.request_id, sample.output_index))
                .copied()
                .unwrap_or_else(|| next_token(&context));
            sampled.push(SampledToken {
                request_id: s.request_id,
                token,
                logprob: -0.5,
            });
        }
        self.copy_blocks(overlapped);
        sampled.reverse();
        let step = StepOutput {
            sampled,
            elapsed: std::time::Duration::ZERO,
            ..StepOutput::default()
        };
        self.input.record(&step).unwrap();
        step
    }
}

impl FakeModel {
    /// Block copies, in order.
    fn copy_blocks(&mut self, copies: &[BlockCopy]) {
        let bs = BLOCK_SIZE;
        for c in copies {
            let (s, d) = (c.src as usize * bs, c.dst as usize * bs);
            if self.host_slots.len() < (c.src.max(c.dst) as usize + 1) * bs {
                self.host_slots
                    .resize((c.src.max(c.dst) as usize + 1) * bs, None);
            }
            let src: Vec<Option<u32>> = match c.kind {
                CopyKind::HostToDevice => self.host_slots[s..s + bs].to_vec(),
                _ => self.slots[s..s + bs].to_vec(),
            };
            match c.kind {
                CopyKind::DeviceToHost => self.host_slots[d..d + bs].copy_from_slice(&src),
                _ => self.slots[d..d + bs].copy_from_slice(&src),
            }
        }
    }
}

/// The plain decode: one request alone, no paging, no batching.
pub(super) fn reference(
    req: &NewRequest,
    script: &Script,
    max_len: usize,
    window: Option<usize>,
) -> (Vec<u32>, FinishReason) {
    if req.prompt_token_ids.len() > max_len {
        return (Vec::new(), FinishReason::Length);
    }
    let mut tokens = req.prompt_token_ids.clone();
    let mut out = Vec::new();
    loop {
        let t = script
            .get(&(req.id, out.len()))
            .copied()
            .unwrap_or_else(|| next_token(&tokens[visible(tokens.len() - 1, window)]));
        tokens.push(t);
        out.push(t);
        if tokens.len() >= max_len || out.len() >= req.params.max_tokens {
            return (out, FinishReason::Length);
        }
        let eos = !req.params.ignore_eos && req.eos_token_ids.contains(&t);
        if eos || req.params.stop_token_ids.contains(&t) {
            return (out, FinishReason::Stop);
        }
    }
}

/// Scheduler + KV manager + fake model, checking invariants around every step.
pub(super) struct Engine {
    pub(super) cfg: SchedulerConfig,
    pub(super) sched: Scheduler,
    pub(super) kv: KvCacheManager,
    pub(super) model: FakeModel,
    pub(super) requests: HashMap<RequestId, NewRequest>,
    pub(super) outputs: HashMap<RequestId, Vec<u32>>,
    pub(super) finished: HashMap<RequestId, FinishReason>,
    pub(super) steps: usize,
    /// Simulated seconds: `schedule` runs at `t`, the step's results come back at `t + step_s`.
    pub(super) t: f64,
    pub(super) step_s: f64,
    /// Most leading blocks freed behind the sliding window that one step reported.
    pub(super) max_freed: usize,
    /// Requests with `n > 1`: their choice count.
    pub(super) groups: HashMap<RequestId, usize>,
}

impl Engine {
    pub(super) fn new(cfg: SchedulerConfig, num_blocks: usize) -> Self {
        Self::with_window(cfg, num_blocks, None)
    }

    /// A model that attends to its last `window` positions (None: all).
    pub(super) fn with_window(
        cfg: SchedulerConfig,
        num_blocks: usize,
        window: Option<usize>,
    ) -> Self {
        Engine {
            sched: Scheduler::new(cfg.clone()),
            cfg,
            kv: KvCacheManager::new(num_blocks, BLOCK_SIZE, true).with_sliding_window(window),
            model: FakeModel::new(num_blocks, window),
            requests: HashMap::new(),
            outputs: HashMap::new(),
            finished: HashMap::new(),
            steps: 0,
            t: 0.0,
            step_s: 0.01,
            max_freed: 0,
            groups: HashMap::new(),
        }
    }

    /// With a host tier of `host_blocks` blocks whose copies cost `cost`.
    pub(super) fn with_host(
        cfg: SchedulerConfig,
        num_blocks: usize,
        host_blocks: usize,
        cost: SwapCost,
    ) -> Self {
        let mut e = Self::new(cfg, num_blocks);
        e.kv = KvCacheManager::new(num_blocks, BLOCK_SIZE, true).with_host_tier(host_blocks);
        e.sched.set_swap_cost(Some(cost));
        e
    }

    /// Simulated clock: each step takes `step_s`.
    pub(super) fn now(&self) -> f64 {
        self.t
    }

    /// Adds a request; with `n > 1`, its choices `id + i` are expected as requests of their
    /// own, with their own seeds (the reference decodes each alone).
    pub(super) fn add(&mut self, req: NewRequest) {
        for i in 0..req.n {
            let choice = NewRequest {
                id: RequestId(req.id.0 + i as u64),
                seed: sample_seed(req.seed, i),
                n: 1,
                ..req.clone()
            };
            self.requests.insert(choice.id, choice);
        }
        if req.n > 1 {
            self.groups.insert(req.id, req.n);
        }
        assert_eq!(self.sched.add_request(req, self.now()), Admission::Accepted);
    }

    pub(super) fn known_tokens(&self, id: RequestId) -> Vec<u32> {
        let mut t = self.requests[&id].prompt_token_ids.clone();
        t.extend(self.outputs.get(&id).into_iter().flatten());
        t
    }

    pub(super) fn schedule(&mut self) -> SchedulerOutput {
        let now = self.now();
        let out = self.sched.schedule(&mut self.kv, now);
        assert!(out.total_num_scheduled_tokens() <= self.cfg.max_num_batched_tokens);
        assert!(out.scheduled.len() <= self.cfg.max_num_seqs);
        assert_eq!(
            out.total_num_scheduled_tokens(),
            out.num_prefill_tokens + out.num_decode_seqs
        );
        for s in &out.scheduled {
            let known = self.known_tokens(s.id);
            let end = s.num_computed_tokens + s.num_tokens;
            assert!(s.num_tokens > 0 && end <= known.len());
            assert_eq!(s.sample, end == known.len());
            if let Some(new) = &s.new {
                assert_eq!(new.token_ids, known);
                assert_eq!(
                    new.num_prompt_tokens,
                    self.requests[&s.id].prompt_token_ids.len()
                );
                assert_eq!(new.seed, self.requests[&s.id].seed);
                assert!(Arc::ptr_eq(&new.params, &self.requests[&s.id].params));
            }
            assert_eq!(s.num_freed_blocks, self.kv.num_freed_blocks(s.id));
            self.max_freed = self.max_freed.max(s.num_freed_blocks);
            // A copy that runs under the forward: the forward never reads the block it fills,
            // nor writes the block it reads (reading it alongside is fine).
            let table = self.kv.block_table(s.id);
            let written: Vec<u32> = (s.num_computed_tokens..end)
                .map(|pos| table[pos / BLOCK_SIZE])
                .collect();
            for c in &out.kv_copies[out.kv_copies_for_forward..] {
                if let Some(b) = c.device_written() {
                    assert!(!table.contains(&b), "{}: block {b} read under {c:?}", s.id);
                }
                if let Some(b) = c.device_read() {
                    assert!(
                        !written.contains(&b),
                        "{}: block {b} written under {c:?}",
                        s.id
                    );
                }
            }
            // Only blocks a sequence owns alone are written.
            for pos in s.num_computed_tokens..end {
                let block = table[pos / BLOCK_SIZE];
                assert_eq!(self.kv.pool().ref_count(block), 1);
            }
        }
        out
    }

    /// Runs the step on the fake executor and checks the flat batch it built from its own
    /// state: the known tokens, sampling state and block tables the scheduler holds.
    pub(super) fn execute(&mut self, out: &SchedulerOutput) -> StepOutput {
        let step = self.model.execute(out);
        if out.is_empty() {
            return step;
        }
        let b = self.model.input.batch();
        let mut start = 0;
        for (seq, s) in b.seqs.iter().zip(&out.scheduled) {
            assert_eq!(seq.request_id, s.id);
            let known = self.known_tokens(s.id);
            assert_eq!(
                b.token_ids[start..start + seq.query_len],
                known[s.num_computed_tokens..seq.context_len]
            );
            start += seq.query_len;
            if let Some(sample) = &seq.sample {
                let prompt = self.requests[&s.id].prompt_token_ids.len();
                assert_eq!(sample.output_index, known.len() - prompt);
                assert_eq!(sample.seed, self.requests[&s.id].seed);
            }
            assert_eq!(b.block_table(seq), self.kv.block_table(s.id));
        }
        assert_eq!(b.seqs.len(), out.scheduled.len());
        step
    }

    pub(super) fn execute_and_update(&mut self, out: &SchedulerOutput) -> Vec<RequestUpdate> {
        let step = self.execute(out);
        self.update(out, &step)
    }

    pub(super) fn update(
        &mut self,
        out: &SchedulerOutput,
        step: &StepOutput,
    ) -> Vec<RequestUpdate> {
        // What the cache holds is exactly the sequence, for every position computed.
        for s in &out.scheduled {
            if !self.requests.contains_key(&s.id) || self.finished.contains_key(&s.id) {
                continue;
            }
            let known = self.known_tokens(s.id);
            let table = self.kv.block_table(s.id);
            let end = s.num_computed_tokens + s.num_tokens;
            let freed = self.kv.num_freed_blocks(s.id) * BLOCK_SIZE;
            for (p, want) in known.iter().enumerate().take(end).skip(freed) {
                let slot = table[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE;
                assert_eq!(self.model.slots[slot], Some(*want), "{}: K/V at {p}", s.id);
            }
        }
        self.t += self.step_s;
        let updates = self
            .sched
            .update_from_output(out, step, &mut self.kv, self.t);
        for u in &updates {
            assert!(
                !self.finished.contains_key(&u.id),
                "{}: update after finishing",
                u.id
            );
            self.outputs
                .entry(u.id)
                .or_default()
                .extend(&u.new_token_ids);
            assert_eq!(u.num_output_tokens, self.outputs[&u.id].len());
            if let Some(reason) = u.finished {
                self.finished.insert(u.id, reason);
                assert!(self.kv.block_table(u.id).is_empty());
            }
        }
        self.check();
        self.steps += 1;
        updates
    }

    pub(super) fn step(&mut self) -> (SchedulerOutput, Vec<RequestUpdate>) {
        let out = self.schedule();
        let updates = self.execute_and_update(&out);
        (out, updates)
    }

    /// Aborts `id`; aborting an `n > 1` request before its fork ends its choices too (the
    /// output processor aborts every choice of a request).
    pub(super) fn abort(&mut self, id: RequestId) {
        assert!(self.sched.abort_request(id, &mut self.kv));
        assert!(self.kv.block_table(id).is_empty() && !self.kv.is_swapped(id));
        self.finished.insert(id, FinishReason::Cancelled);
        for i in 1..self.groups.get(&id).copied().unwrap_or(1) {
            let child = RequestId(id.0 + i as u64);
            if !self.sched.is_known(child) && !self.finished.contains_key(&child) {
                self.finished.insert(child, FinishReason::Cancelled);
            }
        }
        self.check();
    }

    pub(super) fn check(&self) {
        self.sched.check_invariants(&self.kv).unwrap();
        self.kv.check_invariants().unwrap();
    }

    pub(super) fn run_to_completion(&mut self) {
        let limit = self.steps + 10_000;
        while self.sched.has_unfinished() {
            assert!(self.steps < limit, "no progress");
            self.step();
        }
        self.assert_no_leaks();
        assert_eq!(self.sched.num_running() + self.sched.num_waiting(), 0);
    }

    /// No block held in either tier.
    pub(super) fn assert_no_leaks(&self) {
        assert_eq!(self.kv.usage().used_blocks, 0, "device blocks leaked");
        if let Some(h) = self.kv.host_usage() {
            assert_eq!(h.used_blocks, 0, "host blocks leaked");
        }
    }

    /// Every request that was not cancelled produced exactly the reference output.
    pub(super) fn assert_matches_reference(&self) {
        let max_len = self
            .cfg
            .max_model_len
            .min(self.kv.num_blocks() * BLOCK_SIZE);
        for (id, req) in &self.requests {
            let got = self.finished.get(id).copied();
            if got == Some(FinishReason::Cancelled) {
                continue;
            }
            let (want, reason) = reference(req, &self.model.script, max_len, self.model.window);
            assert_eq!(
                self.outputs.get(id).cloned().unwrap_or_default(),
                want,
                "{id} output"
            );
            assert_eq!(got, Some(reason), "{id} finish reason");
        }
    }
}
