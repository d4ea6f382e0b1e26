//! The bundled demo models' golden cases (tests/fixtures/demo_golden.json, tools/demo_model/)
//! and the loop that runs requests through the real scheduler core and any backend: shared by
//! the demo goldens, speculative decoding on the CPU and speculative decoding on CUDA.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use brook::executor::backend::Backend;
use brook::kv::KvCacheManager;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use brook::spec::{SpecConfig, SpecMethod};
use serde_json::Value;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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

/// Runs every request at once through the scheduler core (a token budget of 64: prefills are
/// chunked and share steps with decodes and verifications) and `backend`, speculating as
/// `spec` says; checks after every step that no running request holds a block past its known
/// tokens (rollback) and at the end that every block is back in the pool. Request i has seed
/// `seed + i`; eos ends a request at `eos`.
pub fn run(
    backend: &mut dyn Backend,
    spec: SpecConfig,
    max_model_len: usize,
    eos: &[u32],
    reqs: &[(Vec<u32>, SamplingParams)],
    seed: u64,
) -> Run {
    let info = backend.info();
    let mut kv = KvCacheManager::new(info.num_kv_blocks, info.block_size, true);
    let mut core = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        max_model_len,
        ..SchedulerConfig::default()
    })
    .with_speculation(spec);
    let eos: Arc<[u32]> = eos.into();
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
