//! The bundled demo models' golden cases (tests/fixtures/demo_golden.json, tools/demo_model/)
//! and the loop that runs requests through the real scheduler core and any backend: shared by
//! the demo goldens, speculative decoding on the CPU and speculative decoding on CUDA.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brook::executor::backend::Backend;
use brook::kv::KvCacheManager;
use brook::model::config::ModelConfig;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use brook::spec::{SpecConfig, SpecMethod};
use serde_json::Value;

/// `BROOK_REPO_DIR` when set (the GPU machine runs test binaries built elsewhere, from a copy of
/// the repository), else the source tree the test was built from.
pub fn root() -> PathBuf {
    std::env::var_os("BROOK_REPO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

pub fn fixture() -> Value {
    let text = std::fs::read_to_string(root().join("tests/fixtures/demo_golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The target's golden cases: (prompt ids, transformers' greedy output ids).
pub fn goldens() -> Vec<(Vec<u32>, Vec<u32>)> {
    fixture()["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_token_ids"]), ids(&c["output_token_ids"])))
        .collect()
}

/// A request: prompt ids and sampling params.
pub type Req = (Vec<u32>, SamplingParams);

/// The golden cases as greedy requests (each for its golden output's length), and the
/// golden outputs.
pub fn greedy_goldens() -> (Vec<Req>, Vec<Vec<u32>>) {
    goldens()
        .into_iter()
        .map(|(p, out)| ((p, SamplingParams::greedy(out.len())), out))
        .unzip()
}

/// The first `n` golden prompts as sampled requests (`temperature`, `max_tokens`, eos ignored).
pub fn sampled(n: usize, temperature: f32, max_tokens: usize) -> Vec<Req> {
    goldens()
        .into_iter()
        .take(n)
        .map(|(p, _)| {
            let params = SamplingParams {
                temperature,
                max_tokens,
                ignore_eos: true,
                ..SamplingParams::default()
            };
            (p, params)
        })
        .collect()
}

/// Speculation by `method` at `max_depth` with the bundled draft model for `draft`. The depth
/// is the cost model's to choose in serving; here every decode speculates at max_depth, so that
/// the tests exercise verification whatever the machine's timings.
pub fn spec(method: SpecMethod, max_depth: usize) -> SpecConfig {
    SpecConfig {
        method,
        draft_model: (method == SpecMethod::Draft).then(|| root().join("models/demo-chat-draft")),
        max_depth,
        adaptive: false,
        ..SpecConfig::default()
    }
}

/// What a run gave: each request's output ids, and the drafts verified and accepted.
pub struct Run {
    pub outputs: Vec<Vec<u32>>,
    pub drafts: u64,
    pub accepted: u64,
}

impl Run {
    /// The demo draft agrees with its target often: some drafts must be accepted and some
    /// not, so both the accept and the correct-and-roll-back paths ran.
    pub fn assert_accepts_and_rejects(&self) {
        assert!(
            self.accepted > 0 && self.accepted < self.drafts,
            "{} of {} drafts accepted",
            self.accepted,
            self.drafts
        );
    }
}

/// Two runs of the same seeded sampled requests gave the same tokens, and drafts were verified
/// and some accepted in them.
pub fn assert_reproducible(a: &Run, b: &Run) {
    assert_eq!(a.outputs, b.outputs);
    assert!(
        a.drafts > 0 && a.accepted > 0,
        "{} of {} drafts accepted",
        a.accepted,
        a.drafts
    );
}

/// `run` with the scheduler's default `max_num_seqs`: for backends without a row limit (CPU).
pub fn run(
    backend: &mut dyn Backend,
    spec: SpecConfig,
    model_dir: &Path,
    reqs: &[Req],
    seed: u64,
) -> Run {
    let rows = SchedulerConfig::default().max_num_seqs;
    run_rows(backend, rows, spec, model_dir, reqs, seed)
}

/// Runs every request at once through the scheduler core (a token budget of 64: prefills are
/// chunked and share steps with decodes and verifications; at most `max_num_seqs` running,
/// which must be the backend's own row count, as serving sets both from one config) and
/// `backend`, speculating as `spec` says; checks after every step that no running request
/// holds a block past its known tokens (rollback) and at the end that every block is back in
/// the pool. Request i has seed `seed + i`; the model's config (`model_dir`) gives the context
/// and the eos ids.
pub fn run_rows(
    backend: &mut dyn Backend,
    max_num_seqs: usize,
    spec: SpecConfig,
    model_dir: &Path,
    reqs: &[Req],
    seed: u64,
) -> Run {
    let config = ModelConfig::from_dir(model_dir).unwrap();
    let info = backend.info();
    let mut kv = KvCacheManager::new(info.num_kv_blocks, info.block_size, true);
    let mut core = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs,
        max_model_len: config.max_position_embeddings,
        ..SchedulerConfig::default()
    })
    .with_speculation(spec);
    let eos: Arc<[u32]> = config.eos_token_ids.clone().into();
    for (i, (p, params)) in reqs.iter().enumerate() {
        let req = NewRequest {
            id: RequestId(i as u64),
            prompt_token_ids: p.clone(),
            params: Arc::new(params.clone()),
            seed: seed + i as u64,
            eos_token_ids: eos.clone(),
            n: 1,
        };
        assert_eq!(core.add_request(req, 0.0), Admission::Accepted);
    }
    let mut outputs = vec![Vec::new(); reqs.len()];
    let mut done = vec![false; reqs.len()];
    let mut t = 0.0;
    while core.has_unfinished() {
        t += 0.01;
        let plan = core.schedule(&mut kv, t);
        let step = backend.execute(&plan).unwrap();
        for u in core.update_from_output(&plan, &step, &mut kv, t) {
            let i = u.id.0 as usize;
            outputs[i].extend(u.new_token_ids);
            done[i] |= u.finished.is_some();
        }
        for (i, (p, _)) in reqs.iter().enumerate() {
            let known = p.len() + outputs[i].len();
            let held = kv.block_table(RequestId(i as u64)).len();
            assert!(
                done[i] || held <= known.div_ceil(info.block_size),
                "request {i} holds {held} blocks for {known} known tokens after a step"
            );
        }
    }
    assert_eq!(kv.usage().used_blocks, 0, "blocks leaked");
    let st = core.spec_stats();
    Run {
        outputs,
        drafts: st.num_draft_tokens,
        accepted: st.num_accepted_tokens,
    }
}
