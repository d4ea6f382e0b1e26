//! The CPU backend against transformers on the tiny checkpoint of each model family
//! (tests/goldens): every logits row within 1e-4 of transformers' (both compute in f32 from the
//! same bf16 weights) and the same greedy tokens, from hand-built batches and from the
//! scheduler's per-step diffs (freed blocks behind sliding windows included). The CUDA backend
//! runs the same goldens in tests/cuda_models.rs.

mod goldens;

use brook::executor::backend::Backend;
use brook::executor::cpu::{CpuBackend, CpuBackendOptions};
use brook::model::config::ModelConfig;
use brook::model::llama::KvPool;
use brook::sampling::sampler::argmax;

const TOL: f32 = 1e-4;

fn check_family(family: &str) {
    let g = goldens::golden(family);
    assert_eq!(g.family, family);
    let dir = goldens::dir(family);
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    let opts = CpuBackendOptions {
        block_size: goldens::BLOCK_SIZE,
        kv_cache_bytes: goldens::NUM_BLOCKS * KvPool::bytes_per_block(&cfg, goldens::BLOCK_SIZE),
        num_threads: Some(2),
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
        tensor_parallel_size: 1,
    };
    let mut backend = CpuBackend::load(&dir, opts.clone()).unwrap();
    let mut worst = 0f32;
    let mut rows = 0;
    let freed = goldens::run(
        &cfg,
        &g,
        |batch| backend.forward_logits(batch).unwrap(),
        |r| {
            let d = r
                .got
                .iter()
                .zip(r.want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                d <= TOL,
                "{family} case {} step {}: max |brook - transformers| = {d}",
                r.case,
                r.step
            );
            assert_eq!(
                argmax(&r.got).0,
                r.want_token,
                "{family} case {} step {}",
                r.case,
                r.step
            );
            worst = worst.max(d);
            rows += 1;
        },
    );
    assert_eq!(rows, g.cases.iter().map(|c| c.tokens.len()).sum::<usize>());
    if let Some(w) = cfg.sliding_window {
        assert!(freed > 0, "{family}: window {w} freed no block");
    }
    // The engine's path: per-step diffs into the executor's persistent batch, freed blocks
    // reported by count. Sampling picks transformers' tokens every time.
    let mut backend = CpuBackend::load(&dir, opts).unwrap();
    let report = goldens::run_steps(&cfg, &g, |out| backend.execute(out).unwrap());
    assert_eq!(
        (report.sampled, report.mismatches, report.freed),
        (rows, 0, freed),
        "{family}"
    );
    eprintln!(
        "{family} (transformers {}): {rows} rows, max |diff| {worst:e}, {freed} blocks freed",
        g.transformers
    );
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    check_family("llama3");
}

#[test]
fn mistral_sliding_window_matches_transformers() {
    check_family("mistral");
}

#[test]
fn qwen2_qkv_bias_tied_embeddings_match_transformers() {
    check_family("qwen2");
}

#[test]
fn qwen3_qk_norm_matches_transformers() {
    check_family("qwen3");
}

#[test]
fn phi3_fused_longrope_sliding_window_matches_transformers() {
    check_family("phi3");
}

#[test]
fn fixtures_cover_every_family_and_feature() {
    use brook::model::config::{Architecture, RopeScaling};
    let cfg = |f: &str| ModelConfig::from_dir(&goldens::dir(f)).unwrap();
    let seen: Vec<Architecture> = goldens::FAMILIES
        .iter()
        .map(|f| cfg(f).architecture)
        .collect();
    for a in Architecture::ALL {
        assert!(seen.contains(&a), "{a:?} has no golden");
    }
    assert!(matches!(
        cfg("llama3").rope.scaling,
        RopeScaling::Llama3 { .. }
    ));
    assert_eq!(cfg("mistral").sliding_window, Some(12));
    let q2 = cfg("qwen2");
    assert!(q2.qkv_bias && !q2.o_bias && q2.tie_word_embeddings && q2.sliding_window.is_none());
    let q3 = cfg("qwen3");
    assert!(q3.qk_norm && q3.head_dim * q3.num_attention_heads != q3.hidden_size);
    let phi = cfg("phi3");
    assert!(matches!(phi.rope.scaling, RopeScaling::LongRope { .. }));
    // longrope is served within its original context.
    assert_eq!(
        (phi.max_position_embeddings, phi.sliding_window),
        (64, Some(20))
    );
}
