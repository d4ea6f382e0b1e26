//! Speculative decoding end to end on the CPU backend with the bundled demo pair
//! (models/demo-chat drafted for by models/demo-chat-draft), through the real scheduler core:
//! greedy speculative output equals the transformers goldens (= non-speculative greedy) token
//! for token, with the draft model and with n-gram lookup; a seeded sampled request gives the
//! same tokens on every run; no KV block is leaked by rollback, at any step or at the end.
use std::path::PathBuf;
use std::sync::Arc;

use brook::executor::backend::Backend;
use brook::executor::cpu::{CpuBackend, CpuBackendOptions};
use brook::kv::KvCacheManager;
use brook::model::config::ModelConfig;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use brook::spec::{SpecConfig, SpecMethod};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The golden cases: (prompt ids, transformers' greedy output ids).
fn goldens() -> Vec<(Vec<u32>, Vec<u32>)> {
    let text = std::fs::read_to_string(root().join("tests/fixtures/demo_golden.json")).unwrap();
    let f: Value = serde_json::from_str(&text).unwrap();
    f["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_token_ids"]), ids(&c["output_token_ids"])))
        .collect()
}

fn spec(method: SpecMethod, max_depth: usize) -> SpecConfig {
    SpecConfig {
        method,
        draft_model: (method == SpecMethod::Draft).then(|| root().join("models/demo-chat-draft")),
        max_depth,
        // The depth is the cost model's to choose in serving; here every decode speculates at
        // max_depth, so that the test exercises verification whatever this machine's timings.
        adaptive: false,
        ..SpecConfig::default()
    }
}

struct Run {
    outputs: Vec<Vec<u32>>,
    drafts: u64,
    accepted: u64,
}

/// Runs every request at once through the scheduler core and the CPU backend (small token
/// budget: prefills are chunked and share steps with verifications), checking after every step
/// that no running request holds a block past its known tokens (rollback) and at the end that
/// every block is back in the pool.
fn run(spec: SpecConfig, prompts: &[Vec<u32>], params: &[SamplingParams], seed: u64) -> Run {
    let dir = root().join("models/demo-chat");
    let config = ModelConfig::from_dir(&dir).unwrap();
    let opts = CpuBackendOptions {
        block_size: 4,
        kv_cache_bytes: 64 << 20,
        num_threads: None,
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
    };
    let mut backend = CpuBackend::load_speculative(&dir, opts, &spec).unwrap();
    let info = backend.info();
    let mut kv = KvCacheManager::new(info.num_kv_blocks, info.block_size, true);
    let mut core = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        max_model_len: config.max_position_embeddings,
        ..SchedulerConfig::default()
    })
    .with_speculation(spec);
    let eos: Arc<[u32]> = config.eos_token_ids.clone().into();
    for (i, (p, params)) in prompts.iter().zip(params).enumerate() {
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
    let mut outputs = vec![Vec::new(); prompts.len()];
    let mut done = vec![false; prompts.len()];
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
        for (i, p) in prompts.iter().enumerate() {
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

fn check_greedy_goldens(method: SpecMethod, max_depth: usize) -> Run {
    let cases = goldens();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.0.clone()).collect();
    let params: Vec<SamplingParams> = cases
        .iter()
        .map(|c| SamplingParams::greedy(c.1.len()))
        .collect();
    let r = run(spec(method, max_depth), &prompts, &params, 0);
    for (i, (got, (_, want))) in r.outputs.iter().zip(&cases).enumerate() {
        assert_eq!(got, want, "case {i}: speculative greedy output differs");
    }
    assert!(
        r.drafts > 0,
        "nothing was verified: the test tested nothing"
    );
    r
}

#[test]
fn greedy_with_the_draft_model_equals_the_goldens() {
    let r = check_greedy_goldens(SpecMethod::Draft, 4);
    // The demo draft agrees with its target often: some drafts must be accepted and some not,
    // so both the accept and the correct-and-roll-back paths ran.
    assert!(
        r.accepted > 0 && r.accepted < r.drafts,
        "{} of {}",
        r.accepted,
        r.drafts
    );
}

#[test]
fn greedy_with_ngram_lookup_equals_the_goldens() {
    check_greedy_goldens(SpecMethod::Ngram, 3);
}

#[test]
fn a_seeded_sampled_request_gives_the_same_tokens_every_run() {
    let cases = goldens();
    let prompts: Vec<Vec<u32>> = cases.iter().take(3).map(|c| c.0.clone()).collect();
    let params: Vec<SamplingParams> = prompts
        .iter()
        .map(|_| SamplingParams {
            temperature: 0.7,
            max_tokens: 32,
            ignore_eos: true,
            ..SamplingParams::default()
        })
        .collect();
    let a = run(spec(SpecMethod::Draft, 3), &prompts, &params, 11);
    let b = run(spec(SpecMethod::Draft, 3), &prompts, &params, 11);
    assert_eq!(a.outputs, b.outputs);
    assert!(
        a.drafts > 0 && a.accepted > 0,
        "{} / {}",
        a.accepted,
        a.drafts
    );
}

#[test]
fn seeded_sampling_with_ngram_lookup_gives_the_tokens_of_no_speculation() {
    let cases = goldens();
    let prompts: Vec<Vec<u32>> = cases.iter().take(4).map(|c| c.0.clone()).collect();
    let params: Vec<SamplingParams> = prompts
        .iter()
        .map(|_| SamplingParams {
            temperature: 0.8,
            max_tokens: 40,
            ignore_eos: true,
            ..SamplingParams::default()
        })
        .collect();
    let off = run(spec(SpecMethod::Off, 1), &prompts, &params, 5);
    let ngram = run(spec(SpecMethod::Ngram, 3), &prompts, &params, 5);
    assert_eq!(ngram.outputs, off.outputs);
    assert!(ngram.drafts > 0, "nothing was verified");
}
