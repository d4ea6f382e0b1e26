//! The tiny checkpoints of tests/fixtures/models (one per model family, made with transformers by
//! tools/model_goldens/make_goldens.py) and their goldens: transformers' greedy tokens and the
//! logits each came from. The cases run the way the scheduler would run them: the three prompts
//! of a family in one batch, prefilled in chunks that do not align with blocks while others
//! decode, block tables from a `KvCacheManager` (which frees the blocks that fall behind a
//! sliding window, so a backend that read them would fail), teacher-forced with the golden
//! tokens so every step's logits are compared even after a near-tie.
//!
//! `run` hands a backend hand-built batches (`forward_logits`); `run_steps` hands it the
//! scheduler's per-step diffs (`Backend::execute`: new requests once, then tokens, appended
//! blocks and the count of blocks freed behind the window), so the executor's persistent tables
//! must follow the KV manager's, freed entries included.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brook::kv::KvCacheManager;
use brook::model::config::ModelConfig;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::step::{
    BatchInput, NewRequestData, SampleInput, ScheduledRequest, SchedulerOutput, StepOutput,
    NULL_BLOCK,
};
use serde::Deserialize;

pub const FAMILIES: [&str; 5] = ["llama3", "mistral", "qwen2", "qwen3", "phi3"];

#[derive(Debug, Deserialize)]
pub struct Case {
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

#[derive(Debug, Deserialize)]
pub struct Golden {
    pub family: String,
    pub transformers: String,
    pub cases: Vec<Case>,
}

/// `BROOK_REPO_DIR` when set (the GPU machine runs test binaries built elsewhere, from a copy of
/// the repository), else the source tree the test was built from.
pub fn dir(family: &str) -> PathBuf {
    std::env::var_os("BROOK_REPO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf())
        .join("tests/fixtures/models")
        .join(family)
}

pub fn golden(family: &str) -> Golden {
    let path = dir(family).join("golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Tokens per KV block and prefill chunk: neither divides the other nor the prompt lengths.
pub const BLOCK_SIZE: usize = 4;
const CHUNK: usize = 7;
pub const NUM_BLOCKS: usize = 64;

/// What came out of one sampled row: the golden case, the step, the backend's logits.
pub struct Row<'a> {
    pub case: usize,
    pub step: usize,
    pub got: Vec<f32>,
    pub want: &'a [f32],
    pub want_token: u32,
}

/// One case's part of a step.
struct Planned {
    case: usize,
    /// Known tokens: the prompt, then the golden tokens so far.
    known: Vec<u32>,
    /// First position computed, and how many.
    first: usize,
    len: usize,
    /// The KV manager's table (`NULL_BLOCK` for blocks freed behind the window).
    table: Vec<u32>,
    num_freed: usize,
    sample: bool,
}

/// The cases' progress, and the KV manager that places them.
struct Driver<'g> {
    g: &'g Golden,
    kv: KvCacheManager,
    /// Per case: tokens whose K/V is cached, and golden rows compared so far.
    computed: Vec<usize>,
    steps: Vec<usize>,
    /// Most blocks freed behind the window in one table.
    freed: usize,
}

impl<'g> Driver<'g> {
    fn new(cfg: &ModelConfig, g: &'g Golden) -> Self {
        Driver {
            g,
            kv: KvCacheManager::new(NUM_BLOCKS, BLOCK_SIZE, false)
                .with_sliding_window(cfg.sliding_window),
            computed: vec![0; g.cases.len()],
            steps: vec![0; g.cases.len()],
            freed: 0,
        }
    }

    fn done(&self, case: usize) -> bool {
        self.steps[case] == self.g.cases[case].tokens.len()
    }

    /// The next step (blocks allocated, the chunks counted as computed); None when every case
    /// is done.
    fn next(&mut self) -> Option<Vec<Planned>> {
        let mut plan = Vec::new();
        for (i, c) in self.g.cases.iter().enumerate() {
            if self.done(i) {
                continue;
            }
            let known: Vec<u32> = c
                .prompt
                .iter()
                .chain(&c.tokens[..self.steps[i]])
                .copied()
                .collect();
            let first = self.computed[i];
            let len = (known.len() - first).min(CHUNK);
            let id = RequestId(i as u64);
            self.kv
                .allocate_slots(id, first, len)
                .expect("the pool holds every case");
            let table = self.kv.block_table(id).to_vec();
            let num_freed = self.kv.num_freed_blocks(id);
            assert_eq!(
                num_freed,
                table.iter().filter(|&&b| b == NULL_BLOCK).count()
            );
            self.freed = self.freed.max(num_freed);
            self.computed[i] = first + len;
            plan.push(Planned {
                case: i,
                sample: first + len == known.len(),
                known,
                first,
                len,
                table,
                num_freed,
            });
        }
        (!plan.is_empty()).then_some(plan)
    }

    /// The golden row of `case`'s current step, then on to its next.
    fn row(&mut self, case: usize, got: Vec<f32>) -> Row<'g> {
        let c = &self.g.cases[case];
        let step = self.steps[case];
        self.steps[case] += 1;
        Row {
            case,
            step,
            got,
            want: &c.logits[step],
            want_token: c.tokens[step],
        }
    }
}

/// Runs every case of `g` through `forward` (one hand-built batch → the logits of its sampled
/// sequences, in order) and hands each sampled row to `check`. Returns how many blocks the
/// sliding window freed (0 without one).
pub fn run<'g>(
    cfg: &ModelConfig,
    g: &'g Golden,
    mut forward: impl FnMut(&BatchInput) -> Vec<Vec<f32>>,
    mut check: impl FnMut(Row<'g>),
) -> usize {
    let greedy = Arc::new(SamplingParams::greedy(8));
    let mut d = Driver::new(cfg, g);
    while let Some(plan) = d.next() {
        let mut batch = BatchInput::default();
        for p in &plan {
            let end = p.first + p.len;
            let sample = p.sample.then(|| SampleInput {
                params: greedy.clone(),
                seed: 0,
                output_index: d.steps[p.case],
            });
            batch.push_seq(
                RequestId(p.case as u64),
                &p.known[p.first..end],
                p.first,
                &p.table[..end.div_ceil(BLOCK_SIZE)],
                BLOCK_SIZE,
                sample,
            );
        }
        let rows = forward(&batch);
        assert_eq!(rows.len(), plan.iter().filter(|p| p.sample).count());
        for (p, got) in plan.iter().filter(|p| p.sample).zip(rows) {
            check(d.row(p.case, got));
        }
    }
    d.freed
}

/// Tokens sampled through `run_steps`.
#[derive(Debug, Default, Clone, Copy)]
pub struct StepsReport {
    pub sampled: usize,
    /// Sampled tokens that differed from transformers' (each case was then sent again as new
    /// with the golden tokens, as the scheduler resends a preempted request).
    pub mismatches: usize,
    /// Most blocks freed behind the sliding window in one table.
    pub freed: usize,
}

/// Runs every case of `g` through `execute` as the scheduler would: a `SchedulerOutput` per
/// step carrying per request only what changed (its state once; then tokens, appended blocks
/// and the freed-block count), the executor feeding back the tokens it sampled. Where one
/// differs from the golden token the case is dropped (`preempted`) and sent again whole with
/// the golden tokens, its K/V kept (a full prefix hit), so every case stays teacher-forced.
pub fn run_steps(
    cfg: &ModelConfig,
    g: &Golden,
    mut execute: impl FnMut(&SchedulerOutput) -> StepOutput,
) -> StepsReport {
    let greedy = Arc::new(SamplingParams::greedy(8));
    let mut d = Driver::new(cfg, g);
    let mut report = StepsReport::default();
    // Per case: blocks of its table the executor holds (None: it holds no state for it).
    let mut sent: Vec<Option<usize>> = vec![None; g.cases.len()];
    let (mut drop, mut finished) = (Vec::new(), Vec::new());
    while let Some(plan) = d.next() {
        let mut out = SchedulerOutput {
            preempted: std::mem::take(&mut drop),
            finished_req_ids: std::mem::take(&mut finished),
            ..SchedulerOutput::default()
        };
        for p in &plan {
            let (new, from) = match sent[p.case] {
                Some(n) => (None, n),
                None => (
                    Some(NewRequestData {
                        token_ids: p.known.clone(),
                        num_prompt_tokens: g.cases[p.case].prompt.len(),
                        params: greedy.clone(),
                        seed: 0,
                    }),
                    0,
                ),
            };
            sent[p.case] = Some(p.table.len());
            out.scheduled.push(ScheduledRequest {
                id: RequestId(p.case as u64),
                num_computed_tokens: p.first,
                num_tokens: p.len,
                num_draft_tokens: 0,
                sample: p.sample,
                new_block_ids: p.table[from..].to_vec(),
                num_freed_blocks: p.num_freed,
                truncate_blocks_to: None,
                new,
            });
        }
        let res = execute(&out);
        let sampling: Vec<&Planned> = plan.iter().filter(|p| p.sample).collect();
        assert_eq!(res.sampled.len(), sampling.len());
        for (p, s) in sampling.into_iter().zip(&res.sampled) {
            let id = RequestId(p.case as u64);
            assert_eq!(s.request_id, id);
            let want = d.row(p.case, Vec::new()).want_token;
            report.sampled += 1;
            if s.token != want {
                report.mismatches += 1;
                drop.push(id);
                sent[p.case] = None;
            } else if d.done(p.case) {
                finished.push(id);
            }
        }
    }
    report.freed = d.freed;
    report
}

/// Largest logit minus the second largest.
pub fn top2_gap(l: &[f32]) -> f32 {
    let mut v = l.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}
