//! The CUDA backend against the CPU backend on the same paged batches: chunked prefill over a
//! cached prefix, mixed prefill + decode steps, then greedy decode. Tokens must agree except at
//! near-ties of the reference logits; logits within 2e-2 relative error. Also decode through
//! CUDA graphs (`execute`) against the same reference.
//!
//! Also: `CudaBackend::load` (the checkpoint streamed as bf16) uploads the same bits as the f32
//! loader + `from_weights`.
//!
//! Models: small random-weight checkpoints (`write_test_model`), and `BROOK_E2E_MODEL` (e.g.
//! models/demo-chat) when set. Without a GPU each test says so and returns; with
//! `BROOK_REQUIRE_GPU=1` a missing GPU fails.

mod gpu;
use gpu::have_gpu;
use std::path::Path;
use std::sync::Arc;

use brook::executor::backend::Backend;
use brook::executor::cpu::{CpuBackend, CpuBackendOptions};
use brook::executor::cuda::device::DevBuf;
use brook::executor::cuda::{CudaBackend, CudaBackendOptions, GemvSmem};
use brook::model::config::{Architecture, ModelConfig, WeightDType};
use brook::model::loader::load_weights;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::sampling::sampler::argmax;
use brook::step::{BatchInput, SampleInput};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use testing::{write_test_model, TestModelSpec};

/// The test-model writer, compiled here rather than into the library (see its header).
#[allow(dead_code)]
#[path = "../src/model/testing.rs"]
mod testing;

/// The serving-path harness (a scheduler's steps to completion, the near-tie tally), shared with
/// the CPU backend's unit tests.
#[allow(dead_code)]
#[path = "../src/executor/testing.rs"]
mod harness;
use harness::Tally;

/// The serving path (scheduler steps through the persistent input batch).
#[path = "cuda_e2e/persistent.rs"]
mod persistent;

/// The kernel that keeps the device block tables of that path up to date.
#[path = "cuda_e2e/block_table.rs"]
mod block_table;

/// Penalties, logit bias and logprobs on that path (device token counts).
#[path = "cuda_e2e/penalties.rs"]
mod penalties;

/// The KV memory tier: pinned host blocks, copies on the copy stream, swap and fork.
#[path = "cuda_e2e/kv_tier.rs"]
mod kv_tier;

/// The demo models' goldens and the scheduler loop (shared with tests/spec_decode.rs).
#[path = "demo/mod.rs"]
mod demo;

/// Speculative decoding: verification of n-gram and draft-model proposals on the device.
#[path = "cuda_e2e/spec.rs"]
mod spec;

/// The fp8 (e4m3) KV cache against the bf16 one.
#[path = "cuda_e2e/kv_fp8.rs"]
mod kv_fp8;

/// fp8 (e4m3) linear weights against bf16 ones.
#[path = "cuda_e2e/weights_fp8.rs"]
mod weights_fp8;

/// Tensor parallelism: ranks of the model on one GPU, host-staged collectives.
#[path = "cuda_e2e/tp.rs"]
mod tp;

const BLOCK: usize = 16;

fn cuda_opts(graphs: bool, prefill_gemm_max_len: usize) -> CudaBackendOptions {
    CudaBackendOptions {
        max_kv_cache_bytes: Some(256 << 20),
        max_num_batched_tokens: 4096,
        max_num_seqs: 64,
        cuda_graphs: graphs,
        prefill_gemm_max_len,
        progress: false,
        ..Default::default()
    }
}

/// The test models' usual shape: 256 wide, 8 query heads of 64 over 2 kv heads; each test
/// sets what else it needs (layers, seed, architecture, window).
fn gqa_hd64() -> TestModelSpec {
    TestModelSpec::default()
        .hidden_size(256)
        .heads(8, 2)
        .head_dim(64)
        .intermediate_size(512)
}

/// The CUDA options of the serving-path tests: a pool of 24 blocks of `config`'s (small enough
/// to preempt), 8 sequences, 256 batched tokens.
fn serving_opts(config: &ModelConfig) -> CudaBackendOptions {
    CudaBackendOptions {
        max_kv_cache_bytes: Some(
            24 * brook::executor::cuda::backend::kv_bytes_per_block(
                config,
                BLOCK,
                brook::executor::cuda::KvCacheDtype::Auto,
            ),
        ),
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        progress: false,
        // The baseline the persistent-batch test's switches are compared with; serving's
        // default ("auto") is its `lookahead_auto` variant.
        lookahead: false,
        lookahead_gate_us: None,
        ..Default::default()
    }
}

/// The backend's default (what `brook serve` runs); the tests below that need a given prefill
/// path set the limit themselves.
fn default_gemm_max_len() -> usize {
    CudaBackendOptions::default().prefill_gemm_max_len
}

/// One sequence of the harness: prompt, blocks, and the reference's tokens so far.
struct Seq {
    tokens: Vec<u32>,
    prompt_len: usize,
    computed: usize,
    blocks: Vec<u32>,
}

fn batch_of(seqs: &[Seq], parts: &[(usize, usize, bool)]) -> BatchInput {
    let mut b = BatchInput::default();
    for &(i, n, sample) in parts {
        let s = &seqs[i];
        let context_len = s.computed + n;
        let sample = sample.then(|| SampleInput {
            params: Arc::new(SamplingParams::greedy(1)),
            seed: i as u64,
            output_index: s.tokens.len() - s.prompt_len,
        });
        b.push_seq(
            RequestId(i as u64),
            &s.tokens[s.computed..context_len],
            s.computed,
            &s.blocks[..context_len.div_ceil(BLOCK)],
            BLOCK,
            sample,
        );
    }
    b
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn compare(t: &mut Tally, cpu: &[Vec<f32>], gpu: &[Vec<f32>], what: &str) {
    assert_eq!(cpu.len(), gpu.len(), "{what}: sampled rows");
    for (c, g) in cpu.iter().zip(gpu) {
        let e = rel_err(g, c);
        assert!(
            e.is_finite() && e < 2e-2,
            "{what}: logits relative error {e:.3e}"
        );
        t.worst_rel_err = t.worst_rel_err.max(e);
        t.check(c, argmax(g).0);
    }
}

/// Runs `prompts` through both backends: prefill in chunks of `chunk` tokens (all sequences in
/// each step, so chunks after the first read a cached prefix), a mixed step, then `gen` greedy
/// decode steps teacher-forced with the CPU's tokens. Then replays the decode through `execute`
/// with CUDA graphs on and compares its tokens with the CPU's. Prefill sequences whose context
/// is at most `gemm_max_len` take the GEMM attention path, the others the flash kernel.
/// `prompts` as sequences on disjoint, shuffled blocks (seeded), each with room for `gen` more
/// tokens.
fn on_shuffled_blocks(prompts: Vec<Vec<u32>>, gen: usize, seed: u64) -> Vec<Seq> {
    let per_seq = prompts
        .iter()
        .map(|p| (p.len() + gen + 1).div_ceil(BLOCK))
        .max()
        .unwrap();
    let mut pool: Vec<u32> = (0..(per_seq * prompts.len()) as u32).collect();
    pool.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    prompts
        .into_iter()
        .enumerate()
        .map(|(i, p)| Seq {
            prompt_len: p.len(),
            tokens: p,
            computed: 0,
            blocks: pool[i * per_seq..(i + 1) * per_seq].to_vec(),
        })
        .collect()
}

/// After a step over `parts` (sequence, tokens, samples?): each sequence's computed count moves
/// on, and a sampling one appends the argmax of its row of `logits` (teacher forcing).
fn advance(seqs: &mut [Seq], parts: &[(usize, usize, bool)], logits: &[Vec<f32>]) {
    let mut k = 0;
    for &(i, n, sample) in parts {
        seqs[i].computed += n;
        if sample {
            seqs[i].tokens.push(argmax(&logits[k]).0);
            k += 1;
        }
    }
}

/// Drives `step` over the prompts in chunks of `chunk` (a sequence samples when its prompt is
/// done; `what` = "prefill"), then `gen` decode steps of every sequence ("decode"). Returns each
/// sequence's computed count where decoding started.
fn teacher_forced_steps(
    seqs: &mut Vec<Seq>,
    chunk: usize,
    gen: usize,
    mut step: impl FnMut(&mut Vec<Seq>, Vec<(usize, usize, bool)>, &str),
) -> Vec<usize> {
    while seqs.iter().any(|s| s.computed < s.prompt_len) {
        let parts: Vec<(usize, usize, bool)> = seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.computed < s.prompt_len)
            .map(|(i, s)| {
                let n = chunk.min(s.prompt_len - s.computed);
                (i, n, s.computed + n == s.prompt_len)
            })
            .collect();
        step(seqs, parts, "prefill");
    }
    let decode_start = seqs.iter().map(|s| s.computed).collect();
    for _ in 0..gen {
        let parts: Vec<(usize, usize, bool)> = (0..seqs.len()).map(|i| (i, 1, true)).collect();
        step(seqs, parts, "decode");
    }
    decode_start
}

fn run_both(
    dir: &Path,
    prompts: Vec<Vec<u32>>,
    chunk: usize,
    gen: usize,
    gemm_max_len: usize,
) -> (Tally, Tally) {
    run_both_with(dir, prompts, chunk, gen, |graphs| {
        cuda_opts(graphs, gemm_max_len)
    })
}

/// `run_both` with the CUDA backends' options from `opts(graphs)`.
fn run_both_with(
    dir: &Path,
    prompts: Vec<Vec<u32>>,
    chunk: usize,
    gen: usize,
    opts: impl Fn(bool) -> CudaBackendOptions,
) -> (Tally, Tally) {
    let cfg = ModelConfig::from_dir(dir).unwrap();
    let weights = load_weights(dir, &cfg, false).unwrap();
    let cpu_opts = CpuBackendOptions {
        block_size: BLOCK,
        kv_cache_bytes: 512 << 20,
        num_threads: None,
        progress: false,
        host_kv_cache_bytes: 0,
        copy_bytes_per_s: None,
        tensor_parallel_size: 1,
    };
    let mut cpu = CpuBackend::from_parts(cfg.clone(), weights, &cpu_opts).unwrap();
    let weights = load_weights(dir, &cfg, false).unwrap();
    let mut gpu = CudaBackend::from_weights(cfg.clone(), &weights, opts(false)).unwrap();
    let mut graphed = CudaBackend::from_weights(cfg.clone(), &weights, opts(true)).unwrap();

    let mut seqs = on_shuffled_blocks(prompts, gen, 7);
    let mut t = Tally::default();
    let mut step =
        |seqs: &mut Vec<Seq>, parts: Vec<(usize, usize, bool)>, t: &mut Tally, what: &str| {
            let b = batch_of(seqs, &parts);
            let c = cpu.forward_logits(&b).unwrap();
            let g = gpu.forward_logits(&b).unwrap();
            compare(t, &c, &g, what);
            advance(seqs, &parts, &c);
        };
    let decode_start = teacher_forced_steps(&mut seqs, chunk, gen, |seqs, parts, what| {
        step(seqs, parts, &mut t, what)
    });

    // The same decode steps through execute() on CUDA graphs, on a fresh cache: prefill first.
    let mut tg = Tally::default();
    let mut replay: Vec<Seq> = seqs
        .iter()
        .map(|s| Seq {
            tokens: s.tokens.clone(),
            prompt_len: s.prompt_len,
            computed: 0,
            blocks: s.blocks.clone(),
        })
        .collect();
    let parts: Vec<(usize, usize, bool)> = (0..replay.len())
        .map(|i| (i, decode_start[i], false))
        .collect();
    graphed.execute_batch(&batch_of(&replay, &parts)).unwrap();
    replay
        .iter_mut()
        .zip(&decode_start)
        .for_each(|(s, &d)| s.computed = d);
    for _ in 0..gen {
        let parts: Vec<(usize, usize, bool)> = (0..replay.len()).map(|i| (i, 1, true)).collect();
        let mut b = batch_of(&replay, &parts);
        // output_index of the token being produced, as in the first pass.
        for (s, q) in replay.iter().zip(b.seqs.iter_mut()) {
            q.sample.as_mut().unwrap().output_index = s.computed + 1 - s.prompt_len;
        }
        let out = graphed.execute_batch(&b).unwrap();
        assert_eq!(out.sampled.len(), replay.len());
        for (i, s) in out.sampled.iter().enumerate() {
            assert_eq!(s.request_id, RequestId(i as u64));
            let want = replay[i].tokens[replay[i].computed + 1];
            tg.compared += 1;
            if s.token != want {
                tg.mismatches += 1;
            }
            assert!(
                s.logprob <= 0.0 && s.logprob.is_finite(),
                "logprob {}",
                s.logprob
            );
        }
        replay.iter_mut().for_each(|s| s.computed += 1);
    }
    (t, tg)
}

/// The serving-path tests' prompts: 10 random ones of 20-89 tokens, the even ones starting
/// with the same 40 (prefix-cache hits).
fn shared_prefix_prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut r = ChaCha8Rng::seed_from_u64(11);
    let vocab = vocab as u32;
    let shared: Vec<u32> = (0..40).map(|_| r.random_range(0..vocab)).collect();
    (0..10)
        .map(|i| {
            let mut p: Vec<u32> = (0..r.random_range(20..90))
                .map(|_| r.random_range(0..vocab))
                .collect();
            if i % 2 == 0 {
                let n = p.len().min(shared.len());
                p[..n].copy_from_slice(&shared[..n]);
            }
            p
        })
        .collect()
}

fn random_prompts(n: usize, vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    random_prompts_of(n, vocab, seed, 3..150)
}

fn random_prompts_of(
    n: usize,
    vocab: usize,
    seed: u64,
    lens: std::ops::Range<usize>,
) -> Vec<Vec<u32>> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            (0..r.random_range(lens.clone()))
                .map(|_| r.random_range(0..vocab as u32))
                .collect()
        })
        .collect()
}

fn check_model(spec: TestModelSpec, chunk: usize) {
    check_model_with(spec, chunk, 12, default_gemm_max_len());
}

/// `num_prompts` <= 4 runs decode steps through the `gemv` kernel instead of cuBLAS.
fn check_model_with(spec: TestModelSpec, chunk: usize, num_prompts: usize, gemm_max_len: usize) {
    check_model_opts(spec, chunk, num_prompts, |graphs| {
        cuda_opts(graphs, gemm_max_len)
    });
}

/// `check_model_with` with the CUDA backends' options from `opts(graphs)`.
fn check_model_opts(
    spec: TestModelSpec,
    chunk: usize,
    num_prompts: usize,
    opts: impl Fn(bool) -> CudaBackendOptions,
) {
    if !have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &spec).unwrap();
    let vocab = ModelConfig::from_dir(dir.path()).unwrap().vocab_size;
    let prompts = random_prompts(num_prompts, vocab, 3);
    let (t, tg) = run_both_with(dir.path(), prompts, chunk, 16, opts);
    eprintln!("{spec:?}\n  eager: {t:?}\n  graphs: {tg:?}");
    t.assert_close(&format!("{spec:?}"));
    assert!(
        tg.mismatches * 20 <= tg.compared,
        "graph decode differs from the CPU: {tg:?}"
    );
}

#[test]
fn cuda_matches_cpu_gqa_hd64() {
    check_model(gqa_hd64().layers(3), 40);
}

#[test]
fn cuda_matches_cpu_mha_hd128_llama3_rope_tied() {
    check_model(
        TestModelSpec::default()
            .hidden_size(256)
            .heads(4, 4)
            .head_dim(128)
            .intermediate_size(384)
            .llama3_rope(true)
            .tied(true)
            .seed(5),
        64,
    );
}

#[test]
fn cuda_matches_cpu_small_batches_on_gemv() {
    let spec = gqa_hd64().seed(9);
    check_model_with(spec, 100, 3, default_gemm_max_len());
}

/// The o and down projections adding into the fp32 residual in cuBLAS's epilogue
/// (`residual_gemm`), against the CPU: every prefill chunk and the 12-sequence decode steps
/// take it; with 3 sequences decode stays on the gemv kernels (a bf16 delta) between prefill
/// steps that add, over the same residual.
#[test]
fn cuda_matches_cpu_with_residual_gemm() {
    let mha = TestModelSpec::default()
        .hidden_size(256)
        .heads(4, 4)
        .head_dim(128)
        .intermediate_size(384)
        .seed(23);
    for (spec, num_prompts) in [(gqa_hd64().layers(3).seed(21), 12), (mha, 3)] {
        check_model_opts(spec, 40, num_prompts, |graphs| CudaBackendOptions {
            residual_gemm: true,
            ..cuda_opts(graphs, default_gemm_max_len())
        });
    }
}

/// The gate|up projection in fp32 (`gate_up_bf16` off: `silu_mul` over the GEMM's fp32 output,
/// the default before session 29), against the CPU: prefill chunks and 12-sequence decode steps
/// on cuBLAS, and 3-sequence decode steps on the gemv kernels.
#[test]
fn cuda_matches_cpu_with_fp32_gate_up() {
    for (spec, num_prompts) in [
        (gqa_hd64().layers(3).seed(24), 12),
        (gqa_hd64().seed(25), 3),
    ] {
        check_model_opts(spec, 40, num_prompts, |graphs| CudaBackendOptions {
            gate_up_bf16: false,
            ..cuda_opts(graphs, default_gemm_max_len())
        });
    }
}

/// Decode splits merged in a thread-block cluster (`decode_cluster`, sm_90), against the CPU:
/// an MHA model and a GQA one at 3 sequences (split over up to 16 CTAs each, eager and from
/// CUDA graphs) and 12.
#[test]
fn cuda_matches_cpu_with_cluster_merged_decode() {
    let mha = TestModelSpec::default()
        .hidden_size(256)
        .heads(4, 4)
        .head_dim(128)
        .intermediate_size(384)
        .seed(27);
    for (spec, num_prompts) in [
        (mha, 3),
        (gqa_hd64().layers(3).seed(28), 3),
        (gqa_hd64().seed(29), 12),
    ] {
        check_model_opts(spec, 40, num_prompts, |graphs| CudaBackendOptions {
            decode_cluster: true,
            ..cuda_opts(graphs, default_gemm_max_len())
        });
    }
}

/// Decode on the bulk gemv (kernels/gemv_bulk.cu takes rows of at least a ring stage: hidden
/// 2,048, intermediate 2,816), under every `GemvSmem` (how much shared memory a launch asks for,
/// so that it shares SMs with the kernel before it), against the CPU at 3 sequences, eager and
/// from CUDA graphs.
#[test]
fn cuda_matches_cpu_on_the_bulk_gemv() {
    for mode in [GemvSmem::Roomy, GemvSmem::Tight, GemvSmem::Deep] {
        let spec = TestModelSpec::default()
            .hidden_size(2048)
            .heads(16, 16)
            .head_dim(128)
            .intermediate_size(2816)
            .layers(2)
            .seed(31);
        check_model_opts(spec, 40, 3, |graphs| CudaBackendOptions {
            gemv_smem: mode,
            ..cuda_opts(graphs, default_gemm_max_len())
        });
    }
}

/// `warm_up` (a dummy prefill and decode step at start) succeeds on its own, again on a warm
/// backend, and leaves nothing behind: backends built with it still match the CPU.
#[test]
fn cuda_warm_up_runs_and_leaves_the_backend_as_it_was() {
    if !have_gpu() {
        return;
    }
    let spec = gqa_hd64().layers(2).seed(25);
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &spec).unwrap();
    let mut b = CudaBackend::load(dir.path(), cuda_opts(true, default_gemm_max_len())).unwrap();
    let w = b.warm_up().unwrap();
    assert!(w.prefill_tokens > 0);
    // Every graph bucket up to the backend's rows (cuda_opts: 64 sequences).
    assert_eq!(w.decode_batches, [1, 2, 4, 8, 16, 24, 32, 48, 64]);
    assert_eq!(b.warm_up().unwrap(), w);
    check_model_opts(spec, 40, 12, |graphs| CudaBackendOptions {
        warm_up: true,
        ..cuda_opts(graphs, default_gemm_max_len())
    });
}

/// Prefill attention on the flash kernel only (`prefill_gemm_max_len` 0).
#[test]
fn cuda_matches_cpu_flash_prefill_only() {
    let spec = gqa_hd64().seed(11);
    check_model_with(spec, 40, 12, 0);
}

/// Chunks of 64 queries at up to 1.4k context on the flash kernel: a step's few tiles x 8 heads
/// fill nothing, so from 1k context on the kernel splits over the keys (2 splits of >= 512 keys)
/// and merges in the kernel.
#[test]
fn cuda_matches_cpu_flash_prefill_split_over_keys() {
    if !have_gpu() {
        return;
    }
    let spec = TestModelSpec::default()
        .hidden_size(256)
        .heads(8, 2)
        .head_dim(64)
        .intermediate_size(512)
        .max_position_embeddings(2048)
        .seed(13);
    let dir = tempfile::tempdir().unwrap();
    write_test_model(dir.path(), &spec).unwrap();
    let vocab = ModelConfig::from_dir(dir.path()).unwrap().vocab_size;
    let prompts = random_prompts_of(3, vocab, 4, 700..1400);
    let (t, tg) = run_both(dir.path(), prompts, 64, 8, 0);
    eprintln!("split over keys\n  eager: {t:?}\n  graphs: {tg:?}");
    assert_eq!(
        t.mismatches, 0,
        "greedy tokens differ away from near-ties: {t:?}"
    );
    assert!(
        t.near_tie_mismatches * 20 <= t.compared,
        "too many near-tie flips: {t:?}"
    );
}

/// Prefill attention on the GEMM path only (no limit).
#[test]
fn cuda_matches_cpu_gemm_prefill_only() {
    let spec = gqa_hd64().seed(13);
    check_model_with(spec, 40, 12, usize::MAX);
}

/// Chunks of 40 with a limit of 70 keys: first chunks take the GEMM path, later chunks the
/// flash kernel (or the GEMM path, over a cached prefix, for prompts of up to 70), both within
/// the same steps.
#[test]
fn cuda_matches_cpu_mixed_prefill_paths() {
    let spec = TestModelSpec::default()
        .hidden_size(256)
        .heads(4, 4)
        .head_dim(128)
        .intermediate_size(384)
        .seed(12);
    check_model_with(spec, 40, 12, 70);
}

/// Qwen2.5-7B's grouping (7 query heads per kv head) with its q/k/v biases and tied embeddings.
#[test]
fn cuda_matches_cpu_qwen2_bias_group7() {
    let spec = TestModelSpec::default()
        .architecture(Architecture::Qwen2)
        .hidden_size(256)
        .heads(14, 2)
        .head_dim(64)
        .intermediate_size(512)
        .tied(true)
        .seed(21);
    check_model(spec, 40);
}

/// Qwen3's q/k head norms, at Qwen2.5-14B's grouping (5) and head_dim 128.
#[test]
fn cuda_matches_cpu_qwen3_qk_norm_group5() {
    let spec = TestModelSpec::default()
        .architecture(Architecture::Qwen3)
        .hidden_size(256)
        .heads(10, 2)
        .head_dim(128)
        .intermediate_size(384)
        .seed(22);
    check_model(spec, 64);
}

/// Phi-3: fused checkpoint tensors, head_dim 96, a sliding window shorter than most prompts.
#[test]
fn cuda_matches_cpu_phi3_hd96_sliding_window() {
    let spec = TestModelSpec::default()
        .architecture(Architecture::Phi3)
        .hidden_size(384)
        .heads(4, 4)
        .head_dim(96)
        .intermediate_size(512)
        .sliding_window(Some(50))
        .seed(23);
    check_model(spec, 40);
}

/// Mistral's sliding window on both prefill paths (the GEMM path takes contexts within the
/// window) and in decode, with decode on the gemv kernels.
#[test]
fn cuda_matches_cpu_mistral_sliding_window() {
    let spec = gqa_hd64()
        .architecture(Architecture::Mistral)
        .sliding_window(Some(37))
        .seed(24);
    check_model_with(spec.clone(), 30, 12, 0);
    check_model_with(spec.clone(), 30, 12, usize::MAX);
    check_model_with(spec, 30, 3, 0);
}

/// head_dim 80 and 256, and 16 query heads per kv head (two decode CTAs per kv head).
#[test]
fn cuda_matches_cpu_hd80_and_hd256_group16() {
    let hd80 = TestModelSpec::default()
        .hidden_size(320)
        .heads(4, 2)
        .head_dim(80)
        .intermediate_size(512)
        .seed(25);
    check_model(hd80, 40);
    let hd256 = TestModelSpec::default()
        .hidden_size(256)
        .heads(16, 1)
        .head_dim(256)
        .intermediate_size(512)
        .layers(1)
        .seed(26);
    check_model(hd256, 64);
}

/// `BROOK_E2E_MODEL` (the demo model on the device): 32 prompts, 32 greedy tokens each.
#[test]
fn cuda_matches_cpu_on_a_real_model() {
    let Ok(dir) = std::env::var("BROOK_E2E_MODEL") else {
        eprintln!("BROOK_E2E_MODEL not set: skipped");
        return;
    };
    if !have_gpu() {
        return;
    }
    let dir = Path::new(&dir);
    let tok = brook::tokenizer::Tokenizer::from_dir(dir).unwrap();
    let subjects = [
        "my order",
        "the weather",
        "a refund",
        "shipping times",
        "the warranty",
        "my password",
        "an invoice",
        "the store hours",
    ];
    let asks = [
        "Where is",
        "Tell me about",
        "How do I get",
        "What is the status of",
    ];
    let prompts: Vec<Vec<u32>> = (0..32)
        .map(|i| {
            tok.encode(&format!("{} {}?", asks[i % 4], subjects[i / 4]), true)
                .unwrap()
        })
        .collect();
    let (t, tg) = run_both(dir, prompts, 512, 32, default_gemm_max_len());
    eprintln!("{}: eager: {t:?}\n  graphs: {tg:?}", dir.display());
    assert_eq!(
        t.mismatches, 0,
        "greedy tokens differ away from near-ties: {t:?}"
    );
    assert!(
        tg.mismatches * 20 <= tg.compared,
        "graph decode differs from the CPU: {tg:?}"
    );
}

/// Every weight buffer of `b`, downloaded, in a fixed order.
fn weight_bytes(b: &CudaBackend) -> Vec<Vec<u8>> {
    let w = b.weights();
    let mut bufs: Vec<&DevBuf> = vec![&w.embed, &w.norm];
    for l in &w.layers {
        bufs.extend([
            &l.input_norm,
            &l.qkv.w,
            &l.o.w,
            &l.post_norm,
            &l.gate_up.w,
            &l.down.w,
        ]);
    }
    bufs.extend(&w.lm_head);
    bufs.iter()
        .map(|d| {
            let mut host = vec![0u8; d.bytes()];
            b.gpu().download(&mut host, d.ptr()).unwrap();
            host
        })
        .collect()
}

#[test]
fn streamed_bf16_load_uploads_the_same_bits_as_the_f32_path() {
    if !have_gpu() {
        return;
    }
    let base = TestModelSpec::default()
        .hidden_size(256)
        .heads(4, 2)
        .head_dim(64)
        .intermediate_size(384)
        .layers(2);
    let specs = [
        base.clone().dtype(WeightDType::F16).shards(2).seed(21),
        base.clone().dtype(WeightDType::F32).seed(22),
        base.clone().tied(true).seed(23),
    ];
    for spec in specs {
        let dir = tempfile::tempdir().unwrap();
        write_test_model(dir.path(), &spec).unwrap();
        let cfg = ModelConfig::from_dir(dir.path()).unwrap();
        let weights = load_weights(dir.path(), &cfg, false).unwrap();
        let via_f32 = CudaBackend::from_weights(
            cfg.clone(),
            &weights,
            cuda_opts(false, default_gemm_max_len()),
        )
        .unwrap();
        let want = weight_bytes(&via_f32);
        drop(via_f32);
        let streamed =
            CudaBackend::load(dir.path(), cuda_opts(false, default_gemm_max_len())).unwrap();
        let got = weight_bytes(&streamed);
        assert_eq!(got.len(), want.len(), "{spec:?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "{spec:?}: weight buffer {i} differs");
        }
    }
}
