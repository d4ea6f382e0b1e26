//! fp8 weights (`--quantization fp8`) end to end, against the same model's bf16 weights on the
//! same GPU. Weights and (in GEMMs) activations keep 3 mantissa bits, so the runs cannot agree
//! exactly; each test prints what it measured.
//!
//! - the demo model (trained weights), teacher-forced: chunked prefill (GEMM rows: cuBLASLt's fp8
//!   GEMM over per-token-quantized activations) and decode steps (gemv_fp8) fed the bf16 run's
//!   greedy tokens: every row's logits within 0.4 relative error of bf16's (the H200 measured
//!   0.24 at worst, 0.048 on average), the mean under 0.1, the argmax the same in at least 3 of 4
//!   rows and never a token bf16 scores clearly worse;
//! - a random-weight GQA model the same way (looser: random weights have no margin between
//!   their top logits);
//! - the demo model's greedy goldens through the scheduler (chunked prefill, CUDA graphs for
//!   decode), as the fp8 KV cache's test: 3 of 4 requests agree on their first 8 tokens and half
//!   of all tokens come before a divergence;
//! - the weights take about half the bytes.

use brook::executor::cuda::Quantization;

use super::demo::root;
use super::kv_fp8::{compare_teacher_forced, demo_greedy_agreement, LogitsGap};
use super::*;

fn with_quant(opts: CudaBackendOptions, quantization: Quantization) -> CudaBackendOptions {
    CudaBackendOptions {
        quantization,
        ..opts
    }
}

/// bf16 and fp8 backends of the model in `dir`, teacher-forced over `prompts`.
fn teacher_forced(dir: &Path, prompts: Vec<Vec<u32>>, chunk: usize, max_rel: f64) -> LogitsGap {
    let cfg = ModelConfig::from_dir(dir).unwrap();
    let weights = load_weights(dir, &cfg, false).unwrap();
    let opts = cuda_opts(false, 0);
    let mut bf = CudaBackend::from_weights(
        cfg.clone(),
        &weights,
        with_quant(opts.clone(), Quantization::None),
    )
    .unwrap();
    let mut f8 =
        CudaBackend::from_weights(cfg, &weights, with_quant(opts, Quantization::Fp8)).unwrap();
    let (b16, b8) = (bf.weights().bytes(), f8.weights().bytes());
    assert!(
        (b8 as f64) < 0.6 * b16 as f64 + (bf.weights().embed.bytes() as f64),
        "fp8 weights {b8} bytes against bf16 {b16}"
    );
    compare_teacher_forced(&mut bf, &mut f8, prompts, (chunk, 16), max_rel)
}

fn check(what: &str, gap: &LogitsGap, mean_max: f64, pick_max: f32) {
    let mean = gap.sum_rel_err / gap.rows as f64;
    eprintln!("fp8 vs bf16 weights, {what}: mean logits rel. err. {mean:.3e}, {gap:?}");
    assert!(
        mean < mean_max,
        "mean fp8 logits relative error {mean:.3e}: {gap:?}"
    );
    assert!(
        gap.same_argmax * 4 >= gap.rows * 3,
        "fp8 greedy tokens differ from bf16's in over a quarter of the rows: {gap:?}"
    );
    assert!(
        gap.worst_pick_gap <= pick_max,
        "fp8 picked a token bf16 scores clearly below its top: {gap:?}"
    );
}

#[test]
fn fp8_weights_logits_close_to_bf16_on_the_demo_model() {
    if !have_gpu() {
        return;
    }
    let dir = root().join("models/demo-chat");
    let vocab = ModelConfig::from_dir(&dir).unwrap().vocab_size;
    let gap = teacher_forced(&dir, random_prompts(12, vocab, 7), 40, 0.4);
    check("demo model", &gap, 0.1, 0.1);
}

#[test]
fn fp8_weights_logits_close_to_bf16_gqa_hd64() {
    if !have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &gqa_hd64().layers(3).seed(41)).unwrap();
    let vocab = ModelConfig::from_dir(dir.path()).unwrap().vocab_size;
    let gap = teacher_forced(dir.path(), random_prompts(12, vocab, 5), 40, 0.3);
    check("random GQA hd64", &gap, 0.15, 0.15);
}

/// The demo model's greedy goldens through the scheduler (prefill chunked by a 64-token budget,
/// decode on CUDA graphs), once with each kind of weights.
#[test]
fn fp8_weights_greedy_close_to_bf16_on_the_demo_model() {
    if !have_gpu() {
        return;
    }
    let a = demo_greedy_agreement(|o| with_quant(o, Quantization::Fp8));
    eprintln!("demo model, fp8 vs bf16 weights: {a:?}");
    a.check();
}
