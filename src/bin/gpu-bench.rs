//! `gpu-bench`: measurements of the CUDA executor on synthetic (random, GPU-generated) weights.
//!
//!   gpu-bench attention                 paged decode attention GB/s (ctx x batch), prefill TFLOP/s
//!   gpu-bench prefill-attn              prefill attention, GEMM path vs flash kernel by length
//!   gpu-bench decode  --model NAME      batch-1 decode ms/token (CUDA graphs on and off)
//!   gpu-bench ttft    --model NAME      one prompt of --input-len tokens: time to first token
//!   gpu-bench offline --model NAME      N requests x input/output tokens through brook's scheduler
//!   gpu-bench gemv-sweep                batch-1 GEMV GB/s on the synthetic models' layers: brook's
//!                                       gemv by split and (warps, loads in flight) build, cuBLAS
//!
//! Each prints one JSON object per figure on stdout (`{"figure": ..., ...}`), progress on stderr.
//! The offline run drives brook's own `Scheduler` and `KvCacheManager` step by step (no actors,
//! no tokenizer), so it measures the executor and the scheduler together.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use brook::executor::backend::Backend;
use brook::executor::cuda::compile;
use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::gemm;
use brook::executor::cuda::kernels::{
    self, scores_ld, PagedDecodeParams, PrefillAttnParams, PREFILL_TILE,
};
use brook::executor::cuda::prefill_gemm::{gemm_attention, GemmAttention, GemmPlanner, GemmSeq};
use brook::executor::cuda::{skip, CudaBackend, CudaBackendOptions};
use brook::kv::KvCacheManager;
use brook::model::synthetic::synthetic_config;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use brook::step::{NewRequestData, ScheduledRequest, SchedulerOutput};
use clap::{Parser, Subcommand};
use cudarc::driver::sys::CUevent_flags;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Attention,
    GemvSweep,
    /// One layer's prefill attention (no cached prefix) on both paths, by prompt length, at
    /// batch 1, 8 and 32; then the length from which the flash kernel wins.
    PrefillAttn {
        /// Head shapes of these synthetic models (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [String::from("llama-2-7b"), String::from("llama-3-8b")])]
        model: Vec<String>,
    },
    Decode {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        #[arg(long, default_value_t = 128)]
        input_len: usize,
        #[arg(long, default_value_t = 256)]
        output_len: usize,
        /// brook's defaults only (no variants): for a profiler run.
        #[arg(long)]
        quick: bool,
    },
    Ttft {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        #[arg(long, default_value_t = 2048)]
        input_len: usize,
    },
    Offline {
        #[arg(long, default_value = "llama-2-7b")]
        model: String,
        #[arg(long, default_value_t = 512)]
        num_prompts: usize,
        #[arg(long, default_value_t = 128)]
        input_len: usize,
        #[arg(long, default_value_t = 128)]
        output_len: usize,
        #[arg(long, default_value_t = 512)]
        max_num_seqs: usize,
        #[arg(long, default_value_t = 8192)]
        max_num_batched_tokens: usize,
        #[arg(long)]
        no_cuda_graphs: bool,
    },
}

fn main() -> anyhow::Result<()> {
    brook::logging::init();
    match Cli::parse().cmd {
        Cmd::Attention => attention(),
        Cmd::GemvSweep => gemv_sweep(),
        Cmd::PrefillAttn { model } => prefill_attn(&model),
        Cmd::Decode {
            model,
            input_len,
            output_len,
            quick,
        } => decode(&model, input_len, output_len, quick),
        Cmd::Ttft { model, input_len } => ttft(&model, input_len),
        Cmd::Offline {
            model,
            num_prompts,
            input_len,
            output_len,
            max_num_seqs,
            max_num_batched_tokens,
            no_cuda_graphs,
        } => offline(
            &model,
            num_prompts,
            input_len,
            output_len,
            max_num_seqs,
            max_num_batched_tokens,
            !no_cuda_graphs,
        ),
    }
}

fn emit(v: serde_json::Value) {
    println!("{v}");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `f` with CUDA events: `warmup` untimed runs, then the median of `reps` (ms).
fn time_ms(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    for i in 0..warmup {
        f(i)?;
    }
    let (start, end) = (
        gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
    );
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps {
        start.record(&gpu.stream)?;
        f(i)?;
        end.record(&gpu.stream)?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64);
    }
    Ok(median(times))
}

fn upload<T: Copy>(gpu: &Gpu, data: &[T]) -> anyhow::Result<DevBuf> {
    let b = gpu.alloc(std::mem::size_of_val(data))?;
    gpu.upload(b.ptr(), data)?;
    Ok(b)
}

fn fill_random_bf16(gpu: &Gpu, buf: &DevBuf, seed: u64) -> anyhow::Result<()> {
    let p = kernels::FillParams {
        out: buf.ptr(),
        n: (buf.bytes() / 2) as u64,
        seed,
        scale: 1.0,
        offset: 0.0,
    };
    // SAFETY: buf holds bytes/2 bf16.
    unsafe { kernels::fill_uniform(gpu, &p) }
}

/// Paged decode attention at Llama-2-7B's head shape (32 heads, 32 kv heads, head_dim 128), one
/// layer; bytes = K and V read once + Q + output. Several disjoint caches are rotated so small
/// cases are not served from L2. Then the flash prefill kernel's rate on causal prompts.
fn attention() -> anyhow::Result<()> {
    let gpu = Gpu::open(0)?;
    let (h, kvh, hd, bs) = (32usize, 32usize, 128usize, 16usize);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut rows = Vec::new();
    for &ctx in &[1024usize, 4096, 16384] {
        for &batch in &[1usize, 16, 64] {
            let blocks_per_seq = ctx.div_ceil(bs);
            let kv_bytes = batch * ctx * kvh * hd * 2 * 2;
            let sets = (512usize << 20).div_ceil(kv_bytes).clamp(1, 8);
            let num_blocks = sets * batch * blocks_per_seq;
            let cache_elems = num_blocks * kvh * bs * hd;
            let (k, v) = (gpu.alloc(cache_elems * 2)?, gpu.alloc(cache_elems * 2)?);
            fill_random_bf16(&gpu, &k, 11)?;
            fill_random_bf16(&gpu, &v, 12)?;
            let q = gpu.alloc(batch * h * hd * 2)?;
            fill_random_bf16(&gpu, &q, 13)?;
            let out = gpu.alloc(batch * h * hd * 2)?;
            let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
            perm.shuffle(&mut rng);
            let tables: Vec<DevBuf> = perm
                .chunks(batch * blocks_per_seq)
                .map(|c| upload(&gpu, c))
                .collect::<anyhow::Result<_>>()?;
            let rows_idx: Vec<i32> = (0..batch as i32).collect();
            let (item_row, ctx_lens) = (
                upload(&gpu, &rows_idx)?,
                upload(&gpu, &vec![ctx as i32; batch])?,
            );
            let splits = kernels::decode_splits(gpu.num_sms, batch, kvh, ctx);
            let (part_acc, part_ml) = (
                gpu.alloc(batch * h * splits * hd * 4)?,
                gpu.alloc(batch * h * splits * 2 * 4)?,
            );
            let params = |set: usize| PagedDecodeParams {
                q: q.ptr(),
                k_cache: k.ptr(),
                v_cache: v.ptr(),
                item_row: item_row.ptr(),
                item_seq: item_row.ptr(),
                block_tables: tables[set].ptr(),
                context_lens: ctx_lens.ptr(),
                out: out.ptr(),
                part_acc: part_acc.ptr(),
                part_ml: part_ml.ptr(),
                num_items: batch as i32,
                num_heads: h as i32,
                num_kv_heads: kvh as i32,
                block_size: bs as i32,
                max_blocks: blocks_per_seq as i32,
                num_splits: splits as i32,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            // SAFETY: every buffer above matches the shapes in the params.
            let ms = time_ms(&gpu, 3, 20, |i| unsafe {
                kernels::paged_decode(&gpu, &params(i % sets), hd)
            })?;
            let bytes = kv_bytes + 2 * batch * h * hd * 2;
            let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
            eprintln!("paged decode ctx {ctx:>5} batch {batch:>2}: {ms:.3} ms, {gbps:.0} GB/s ({:.0}% of 4300), {splits} splits", gbps / 43.0);
            rows.push(json!({"ctx": ctx, "batch": batch, "ms": ms, "gbps": gbps, "pct_of_4300": gbps / 43.0, "splits": splits}));
        }
    }
    emit(
        json!({"figure": "paged_decode_attention", "heads": h, "kv_heads": kvh, "head_dim": hd, "block_size": bs, "rows": rows}),
    );

    let mut prefill_rows = Vec::new();
    for &len in &[128usize, 512, 2048, 8192] {
        let seqs = (16384 / len).max(1);
        let t = seqs * len;
        let num_blocks = t.div_ceil(bs) + seqs;
        let cache_elems = num_blocks * kvh * bs * hd;
        let (k, v) = (gpu.alloc(cache_elems * 2)?, gpu.alloc(cache_elems * 2)?);
        fill_random_bf16(&gpu, &k, 21)?;
        fill_random_bf16(&gpu, &v, 22)?;
        let q = gpu.alloc(t * h * hd * 2)?;
        fill_random_bf16(&gpu, &q, 23)?;
        let out = gpu.alloc(t * h * hd * 2)?;
        let bps = len.div_ceil(bs);
        let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
        perm.shuffle(&mut rng);
        let bt: Vec<i32> = perm[..seqs * bps].to_vec();
        let (mut tile_seq, mut tile_q0) = (Vec::new(), Vec::new());
        for s in 0..seqs {
            for q0 in (0..len).step_by(PREFILL_TILE) {
                tile_seq.push(s as i32);
                tile_q0.push(q0 as i32);
            }
        }
        let q_start: Vec<i32> = (0..seqs).map(|s| (s * len) as i32).collect();
        let b = [
            upload(&gpu, &tile_seq)?,
            upload(&gpu, &tile_q0)?,
            upload(&gpu, &q_start)?,
            upload(&gpu, &vec![len as i32; seqs])?,
            upload(&gpu, &bt)?,
        ];
        let p = PrefillAttnParams {
            q: q.ptr(),
            k_cache: k.ptr(),
            v_cache: v.ptr(),
            tile_seq: b[0].ptr(),
            tile_q0: b[1].ptr(),
            q_start: b[2].ptr(),
            q_len: b[3].ptr(),
            context_lens: b[3].ptr(),
            block_tables: b[4].ptr(),
            out: out.ptr(),
            num_tiles: tile_seq.len() as i32,
            num_heads: h as i32,
            num_kv_heads: kvh as i32,
            block_size: bs as i32,
            max_blocks: bps as i32,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        // SAFETY: buffers match the params' shapes.
        let ms = time_ms(&gpu, 2, 10, |_| unsafe {
            kernels::prefill_attn(&gpu, &p, hd)
        })?;
        // Causal: QK^T and PV over len (len + 1) / 2 key-query pairs per head.
        let flops = 4.0 * (seqs * h * hd) as f64 * (len * (len + 1) / 2) as f64;
        let tflops = flops / (ms * 1e-3) / 1e12;
        eprintln!("prefill attention {seqs} x {len}: {ms:.3} ms, {tflops:.0} TFLOP/s");
        prefill_rows.push(json!({"seq_len": len, "seqs": seqs, "ms": ms, "tflops": tflops}));
    }
    emit(json!({"figure": "prefill_attention", "heads": h, "head_dim": hd, "rows": prefill_rows}));
    Ok(())
}

/// Prefill attention of one layer at a model's head shape, `batch` prompts of `len` tokens (no
/// cached prefix), on the GEMM path (gather + S GEMMs + causal softmax + P·V GEMMs, all it costs)
/// and on the flash kernel, timed with CUDA events (median of many runs). Each point also
/// checks that the two outputs agree.
fn prefill_attn(models: &[String]) -> anyhow::Result<()> {
    let gpu = Gpu::open(0)?;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    const LENS: [usize; 8] = [16, 32, 64, 128, 256, 512, 1024, 2048];
    for model in models {
        let cfg = synthetic_config(model)?;
        let shape = PrefillShape {
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            block_size: 16,
        };
        // Batch 32 too (up to 16k tokens a step), as the GEMM path's launches grow per sequence.
        for batch in [1usize, 8, 32] {
            let mut points = Vec::new();
            for len in LENS.into_iter().filter(|l| batch * l <= 16384) {
                let (gemm_us, flash_us, rel_err) =
                    prefill_attn_point(&gpu, &shape, batch, len, &mut rng)?;
                eprintln!(
                    "prefill attention {model} batch {batch} q_len {len:>4}: gemm {gemm_us:8.1} us, flash {flash_us:8.1} us (outputs differ by {rel_err:.1e})"
                );
                anyhow::ensure!(
                    rel_err < 2e-2,
                    "GEMM path and flash kernel disagree: relative difference {rel_err:.3e}"
                );
                emit(json!({
                    "figure": "prefill_attn_paths", "shape": model, "heads": shape.heads,
                    "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "batch": batch,
                    "q_len": len, "gemm_us": gemm_us, "flash_us": flash_us, "rel_diff": rel_err,
                }));
                points.push((len, gemm_us, flash_us));
            }
            // The smallest length from which flash wins at every longer length measured, and
            // the limit that follows for `prefill_gemm_max_len`: the longest length up to which
            // the GEMM path wins at every length (0: it loses already at the shortest).
            let from = points
                .iter()
                .rev()
                .take_while(|p| p.2 < p.1)
                .last()
                .map(|p| p.0);
            let gemm_up_to = points
                .iter()
                .take_while(|p| p.1 < p.2)
                .last()
                .map_or(0, |p| p.0);
            let gemm_wins_at: Vec<usize> =
                points.iter().filter(|p| p.1 < p.2).map(|p| p.0).collect();
            eprintln!(
                "prefill attention {model} batch {batch}: flash wins from q_len {from:?}; GEMM path wins at {gemm_wins_at:?}; suggested prefill_gemm_max_len {gemm_up_to}"
            );
            emit(json!({
                "figure": "prefill_attn_crossover", "shape": model, "batch": batch,
                "flash_wins_from_q_len": from, "gemm_wins_at_q_len": gemm_wins_at,
                "suggested_prefill_gemm_max_len": gemm_up_to,
            }));
        }
    }
    Ok(())
}

struct PrefillShape {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
}

/// (GEMM path µs, flash µs, relative difference of their outputs) for one point.
fn prefill_attn_point(
    gpu: &Gpu,
    shape: &PrefillShape,
    batch: usize,
    len: usize,
    rng: &mut ChaCha8Rng,
) -> anyhow::Result<(f64, f64, f64)> {
    let (h, kvh, hd, bs) = (
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
        shape.block_size,
    );
    let t = batch * len;
    let bps = len.div_ceil(bs);
    let num_blocks = batch * bps;
    let cache_elems = num_blocks * kvh * bs * hd;
    let (k, v) = (gpu.alloc(cache_elems * 2)?, gpu.alloc(cache_elems * 2)?);
    fill_random_bf16(gpu, &k, 31)?;
    fill_random_bf16(gpu, &v, 32)?;
    let q = gpu.alloc(t * h * hd * 2)?;
    fill_random_bf16(gpu, &q, 33)?;
    let (out_gemm, out_flash) = (gpu.alloc(t * h * hd * 2)?, gpu.alloc(t * h * hd * 2)?);
    let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
    perm.shuffle(rng);
    let (mut tile_seq, mut tile_q0) = (Vec::new(), Vec::new());
    let mut planner = GemmPlanner::new(usize::MAX, h, usize::MAX, usize::MAX);
    let mut seqs: Vec<GemmSeq> = Vec::new();
    for s in 0..batch {
        for q0 in (0..len).step_by(PREFILL_TILE) {
            tile_seq.push(s as i32);
            tile_q0.push(q0 as i32);
        }
        seqs.push(
            planner
                .place(s, s * len, len, len)
                .context("unbounded planner")?,
        );
    }
    let last = seqs[batch - 1];
    let keys = last.key0 + last.ctx;
    let score_floats = last.s0 + h * len * scores_ld(len);
    anyhow::ensure!(
        score_floats <= i32::MAX as usize,
        "scores offsets overflow i32"
    );
    let (k_buf, v_buf) = (gpu.alloc(keys * h * hd * 2)?, gpu.alloc(keys * h * hd * 2)?);
    let scores = gpu.alloc(score_floats * 4)?;
    let col = |f: fn(&GemmSeq) -> usize| -> Vec<i32> { seqs.iter().map(|s| f(s) as i32).collect() };
    let b = [
        upload(gpu, &tile_seq)?,
        upload(gpu, &tile_q0)?,
        upload(
            gpu,
            &(0..batch).map(|s| (s * len) as i32).collect::<Vec<_>>(),
        )?,
        upload(gpu, &vec![len as i32; batch])?,
        upload(gpu, &perm)?,
        upload(gpu, &col(|s| s.seq))?,
        upload(gpu, &col(|s| s.key0))?,
        upload(gpu, &col(|s| s.s0))?,
    ];
    let scale = 1.0 / (hd as f32).sqrt();
    let flash = PrefillAttnParams {
        q: q.ptr(),
        k_cache: k.ptr(),
        v_cache: v.ptr(),
        tile_seq: b[0].ptr(),
        tile_q0: b[1].ptr(),
        q_start: b[2].ptr(),
        q_len: b[3].ptr(),
        context_lens: b[3].ptr(),
        block_tables: b[4].ptr(),
        out: out_flash.ptr(),
        num_tiles: tile_seq.len() as i32,
        num_heads: h as i32,
        num_kv_heads: kvh as i32,
        block_size: bs as i32,
        max_blocks: bps as i32,
        scale,
    };
    let gemm = GemmAttention {
        q: q.ptr(),
        out: out_gemm.ptr(),
        k_cache: k.ptr(),
        v_cache: v.ptr(),
        q_lens: b[3].ptr(),
        context_lens: b[3].ptr(),
        block_tables: b[4].ptr(),
        gemm_seq: b[5].ptr(),
        gemm_key0: b[6].ptr(),
        gemm_s0: b[7].ptr(),
        k_buf: k_buf.ptr(),
        v_buf: v_buf.ptr(),
        scores: scores.ptr(),
        seqs: &seqs,
        num_heads: h,
        num_kv_heads: kvh,
        head_dim: hd,
        block_size: bs,
        max_blocks: bps,
        scale,
    };
    let reps = if len <= 256 { 100 } else { 30 };
    // SAFETY: every buffer above matches the shapes in the params.
    let gemm_ms = time_ms(gpu, 5, reps, |_| unsafe { gemm_attention(gpu, &gemm) })?;
    let flash_ms = time_ms(gpu, 5, reps, |_| unsafe {
        kernels::prefill_attn(gpu, &flash, hd)
    })?;
    let mut a = vec![0u16; t * h * hd];
    let mut f = vec![0u16; t * h * hd];
    gpu.download(&mut a, out_gemm.ptr())?;
    gpu.download(&mut f, out_flash.ptr())?;
    let bf = |x: u16| f32::from_bits((x as u32) << 16) as f64;
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(&f) {
        num += (bf(*x) - bf(*y)).powi(2);
        den += bf(*y).powi(2);
    }
    // A NaN anywhere makes the difference NaN, which fails the caller's check.
    let rel = (num / den.max(1e-30)).sqrt();
    Ok((gemm_ms * 1e3, flash_ms * 1e3, rel))
}

/// brook's defaults with the progress bar off; each bench overrides what it measures.
fn bench_options() -> CudaBackendOptions {
    CudaBackendOptions {
        progress: false,
        ..Default::default()
    }
}

fn backend(model: &str, opts: CudaBackendOptions) -> anyhow::Result<CudaBackend> {
    let cfg = synthetic_config(model)?;
    let started = Instant::now();
    let b = CudaBackend::synthetic(cfg, 0, opts)?;
    eprintln!(
        "{model}: synthetic weights and KV pool ready in {:.1} s; {:?}",
        started.elapsed().as_secs_f64(),
        b.info()
    );
    Ok(b)
}

/// A step of one request decoding alone, through the executor's persistent input batch as the
/// server runs it: `n` tokens from position `start`; the first step (`start` 0) sends the prompt
/// and every block, later ones nothing but the count (the executor feeds back its own tokens).
/// `drop`: a request the executor should forget first.
fn one_seq_step(
    id: u64,
    prompt: &[u32],
    start: usize,
    n: usize,
    blocks: &[u32],
    drop: Option<u64>,
) -> SchedulerOutput {
    let new = (start == 0).then(|| NewRequestData {
        token_ids: prompt.to_vec(),
        num_prompt_tokens: prompt.len(),
        params: Arc::new(SamplingParams::greedy(1)),
        seed: id,
    });
    SchedulerOutput {
        scheduled: vec![ScheduledRequest {
            id: RequestId(id),
            num_computed_tokens: start,
            num_tokens: n,
            sample: true,
            new_block_ids: if start == 0 {
                blocks.to_vec()
            } else {
                Vec::new()
            },
            new,
        }],
        finished_req_ids: drop.map(RequestId).into_iter().collect(),
        ..SchedulerOutput::default()
    }
}

/// Batch-1 greedy decode after a prompt: median step time over the run, for brook's defaults and
/// then one setting changed at a time.
fn decode(model: &str, input_len: usize, output_len: usize, quick: bool) -> anyhow::Result<()> {
    let base = CudaBackendOptions {
        max_num_seqs: 8,
        max_num_batched_tokens: input_len.max(256),
        ..bench_options()
    };
    let variants = [
        base.clone(),
        CudaBackendOptions {
            gemv_split: 1,
            ..base.clone()
        },
        CudaBackendOptions {
            gemv_split: 2,
            ..base.clone()
        },
        CudaBackendOptions {
            gemv_split: 4,
            ..base.clone()
        },
        CudaBackendOptions {
            fuse_decode: true,
            ..base.clone()
        },
        CudaBackendOptions {
            pdl: false,
            ..base.clone()
        },
        CudaBackendOptions {
            gemv_max_rows: 0,
            ..base.clone()
        },
        CudaBackendOptions {
            cuda_graphs: false,
            ..base.clone()
        },
    ];
    // What each kind of launch costs inside the step: the default with that kind left out.
    let skips = [
        ("norms", skip::NORMS),
        ("rope", skip::ROPE),
        ("attention", skip::ATTENTION),
        ("silu", skip::SILU),
        (
            "all but linear",
            skip::NORMS | skip::ROPE | skip::ATTENTION | skip::SILU,
        ),
        ("linear", skip::LINEAR),
    ];
    let variants = variants
        .into_iter()
        .map(|o| (o, ""))
        .chain(skips.into_iter().map(|(name, bits)| {
            (
                CudaBackendOptions {
                    skip: bits,
                    ..base.clone()
                },
                name,
            )
        }));
    let count = if quick { 1 } else { usize::MAX };
    for (opts, skipped) in variants.take(count) {
        let (graphs, gemv, fuse, pdl, split) = (
            opts.cuda_graphs,
            opts.gemv_max_rows > 0,
            opts.fuse_decode,
            opts.pdl,
            opts.gemv_split,
        );
        let mut b = backend(model, opts)?;
        let bs = b.info().block_size;
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let vocab = b.config().vocab_size as u32;
        let prompt: Vec<u32> = (0..input_len).map(|_| rng.random_range(0..vocab)).collect();
        let blocks: Vec<u32> = (0..(input_len + output_len + 1).div_ceil(bs) as u32).collect();
        // A step with launches skipped samples from garbage: the backend keeps such tokens in
        // the vocabulary when `skip` is set.
        b.execute(&one_seq_step(1, &prompt, 0, input_len, &blocks, None))?;
        let mut steps = Vec::with_capacity(output_len);
        for i in 1..output_len {
            let pos = input_len + i - 1;
            let t0 = Instant::now();
            b.execute(&one_seq_step(1, &prompt, pos, 1, &blocks, None))?;
            steps.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        let warm = steps[8..].to_vec();
        let med = median(warm.clone());
        let mean = warm.iter().sum::<f64>() / warm.len() as f64;
        eprintln!(
            "{model} decode batch 1, graphs {graphs}, gemv {gemv}, split {split}, fused {fuse}, pdl {pdl}, skipped [{skipped}]: median {med:.3} ms/token, mean {mean:.3}",
        );
        emit(
            json!({"figure": "decode_b1_ms_per_token", "model": model, "cuda_graphs": graphs, "gemv": gemv, "gemv_split": split, "fused": fuse, "pdl": pdl, "input_len": input_len, "output_len": output_len, "median_ms": med, "mean_ms": mean, "skipped": skipped}),
        );
    }
    Ok(())
}

/// One prompt in one step (prefill + first token), median of 5 on fresh blocks.
fn ttft(model: &str, input_len: usize) -> anyhow::Result<()> {
    let mut b = backend(
        model,
        CudaBackendOptions {
            max_num_seqs: 8,
            max_num_batched_tokens: input_len,
            ..bench_options()
        },
    )?;
    let bs = b.info().block_size;
    let vocab = b.config().vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut times = Vec::new();
    for rep in 0..6 {
        let tokens: Vec<u32> = (0..input_len).map(|_| rng.random_range(0..vocab)).collect();
        let per = input_len.div_ceil(bs) as u32;
        let blocks: Vec<u32> = (rep * per..(rep + 1) * per).collect();
        let last = rep.checked_sub(1).map(u64::from);
        let t0 = Instant::now();
        b.execute(&one_seq_step(
            rep.into(),
            &tokens,
            0,
            input_len,
            &blocks,
            last,
        ))?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let med = median(times[1..].to_vec());
    eprintln!("{model} ttft for {input_len} tokens: {med:.2} ms (runs {times:.2?})");
    emit(json!({"figure": "ttft_b1_ms", "model": model, "input_len": input_len, "median_ms": med}));
    Ok(())
}

/// All requests submitted at once, ignore_eos, greedy; brook's scheduler decides every step.
fn offline(
    model: &str,
    n: usize,
    input_len: usize,
    output_len: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    graphs: bool,
) -> anyhow::Result<()> {
    let mut b = backend(
        model,
        CudaBackendOptions {
            max_num_seqs,
            max_num_batched_tokens,
            cuda_graphs: graphs,
            ..bench_options()
        },
    )?;
    let info = b.info();
    let vocab = b.config().vocab_size as u32;
    let max_model_len = b.config().max_position_embeddings;
    let mut kv = KvCacheManager::new(info.num_kv_blocks, info.block_size, true);
    let mut sched = Scheduler::new(SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        long_prefill_token_threshold: 0,
        ..Default::default()
    });
    // The scheduler runs on explicit time (seconds since `clock`).
    let clock = Instant::now();
    let now = || clock.elapsed().as_secs_f64();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let params = Arc::new(SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(output_len)
    });
    let eos: Arc<[u32]> = Arc::from(vec![2u32]);
    // A warm-up request first: graph capture and cuBLAS heuristics stay out of the timing.
    let warm = NewRequest {
        id: RequestId(u64::MAX),
        prompt_token_ids: (0..input_len).map(|_| rng.random_range(0..vocab)).collect(),
        params: Arc::new(SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(8)
        }),
        seed: 0,
        eos_token_ids: eos.clone(),
    };
    anyhow::ensure!(
        matches!(sched.add_request(warm, now()), Admission::Accepted),
        "warm-up request refused"
    );
    while sched.has_unfinished() {
        let out = sched.schedule(&mut kv, now());
        let step = if out.is_empty() {
            Default::default()
        } else {
            b.execute(&out)?
        };
        sched.update_from_output(&out, &step, &mut kv, now());
    }
    let started = Instant::now();
    for i in 0..n as u64 {
        let prompt: Vec<u32> = (0..input_len).map(|_| rng.random_range(0..vocab)).collect();
        let req = NewRequest {
            id: RequestId(i),
            prompt_token_ids: prompt,
            params: params.clone(),
            seed: i,
            eos_token_ids: eos.clone(),
        };
        let admitted = sched.add_request(req, now());
        anyhow::ensure!(
            matches!(admitted, Admission::Accepted),
            "request {i} refused: {admitted:?}"
        );
    }
    let (mut steps, mut generated, mut first_token) = (0usize, 0usize, vec![None; n]);
    let mut step_ms = Vec::new();
    while sched.has_unfinished() {
        let out = sched.schedule(&mut kv, now());
        let t0 = Instant::now();
        let step = if out.is_empty() {
            Default::default()
        } else {
            b.execute(&out)?
        };
        step_ms.push((
            out.total_num_scheduled_tokens(),
            out.scheduled.len(),
            t0.elapsed().as_secs_f64() * 1e3,
        ));
        for s in &step.sampled {
            generated += 1;
            first_token[s.request_id.0 as usize].get_or_insert(started.elapsed());
        }
        sched.update_from_output(&out, &step, &mut kv, now());
        steps += 1;
    }
    let wall = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        generated == n * output_len,
        "generated {generated} tokens, expected {}",
        n * output_len
    );
    let mut ttft: Vec<f64> = first_token
        .iter()
        .map(|t| {
            t.context("a request never produced a token")
                .map(|d| d.as_secs_f64() * 1e3)
        })
        .collect::<anyhow::Result<_>>()?;
    ttft.sort_by(f64::total_cmp);
    let exec_ms: f64 = step_ms.iter().map(|s| s.2).sum();
    let decode_steps: Vec<f64> = step_ms
        .iter()
        .filter(|s| s.0 == s.1 && s.1 > 0)
        .map(|s| s.2)
        .collect();
    let largest_decode = step_ms
        .iter()
        .filter(|s| s.0 == s.1)
        .map(|s| s.1)
        .max()
        .unwrap_or(0);
    let out_tok_s = generated as f64 / wall;
    eprintln!(
        "{model} offline {n} x {input_len}/{output_len}: {wall:.2} s, {out_tok_s:.0} output tok/s, {steps} steps ({:.0}% of wall in execute), median decode step {:.2} ms (largest decode batch {largest_decode}), ttft p50 {:.0} ms",
        exec_ms / 10.0 / wall,
        median(decode_steps.clone()),
        ttft[n / 2]
    );
    emit(json!({
        "figure": "offline_out_tok_s", "model": model, "num_prompts": n, "input_len": input_len, "output_len": output_len,
        "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens, "cuda_graphs": graphs,
        "wall_s": wall, "output_tok_s": out_tok_s, "total_tok_s": (n * (input_len + output_len)) as f64 / wall,
        "steps": steps, "execute_share": exec_ms / 1e3 / wall, "median_decode_step_ms": median(decode_steps),
        "ttft_ms_p50": ttft[n / 2], "ttft_ms_p99": ttft[(n * 99) / 100],
    }));
    Ok(())
}

/// Batch-1 GEMV on the linear layers of the synthetic models: GB/s of weights streamed by
/// brook's gemv kernel at each split (warps per row) for a few (warps per CTA, 16-byte loads in
/// flight per lane) builds, and by cuBLAS. Each figure is the median of 30 runs of 20 back-to-back
/// launches (kernels queue as in a decode step, with no event between them), divided by 20;
/// weights rotate through 2 GiB so no launch reads them from L2.
fn gemv_sweep() -> anyhow::Result<()> {
    const INNER: usize = 20;
    let mut gpu = Gpu::open(0)?;
    let (major, minor) = gpu.compute_capability;
    let arch = compile::arch_for(major, minor);
    let src = compile::SOURCES
        .iter()
        .find(|(name, _)| *name == "gemv")
        .context("gemv.cu is embedded")?
        .1;
    let region = 2usize << 30;
    let w = gpu.alloc(region)?;
    fill_random_bf16(&gpu, &w, 1)?;
    let mut shapes = Vec::new();
    for model in ["llama-2-7b", "llama-3-8b", "tinyllama-1.1b"] {
        let c = synthetic_config(model)?;
        let (d, inter) = (c.hidden_size, c.intermediate_size);
        shapes.extend([
            (model, "qkv", c.q_dim() + 2 * c.kv_dim(), d),
            (model, "o", d, c.q_dim()),
            (model, "gate_up", 2 * inter, d),
            (model, "down", d, inter),
            (model, "lm_head", c.vocab_size, d),
        ]);
    }
    let max_k = shapes.iter().map(|s| s.3).max().unwrap_or(0);
    let max_n = shapes.iter().map(|s| s.2).max().unwrap_or(0);
    let x = gpu.alloc(max_k * 2)?;
    fill_random_bf16(&gpu, &x, 2)?;
    let y = gpu.alloc(max_n * 4)?;
    // Median ms of one launch of `launch(weights offset)` over [n, k] weights.
    let time = |gpu: &Gpu, n: usize, k: usize, launch: &dyn Fn(u64) -> anyhow::Result<()>| {
        let bytes = n * k * 2;
        let copies = (region / bytes).max(1);
        let ms = time_ms(gpu, 2, 30, |i| {
            for j in 0..INNER {
                launch(w.ptr() + (((i * INNER + j) % copies) * bytes) as u64)?;
            }
            Ok(())
        })?;
        Ok::<f64, anyhow::Error>(ms / INNER as f64)
    };
    let rate = |model: &str, name: &str, variant: &str, n: usize, k: usize, auto: bool, ms: f64| {
        let gbps = (n * k * 2) as f64 / (ms * 1e-3) / 1e9;
        eprintln!(
            "gemv {model} {name} {n}x{k} {variant}{}: {:.1} us, {gbps:.0} GB/s",
            if auto { " (auto)" } else { "" },
            ms * 1e3
        );
        emit(
            json!({"figure": "gemv_b1", "model": model, "layer": name, "n": n, "k": k, "variant": variant, "auto": auto, "us": ms * 1e3, "gbps": gbps, "pct_of_4300": gbps / 43.0, "timing": "median of 30 x 20 back-to-back launches"}),
        );
    };
    for (warps, unroll) in [(8u32, 2usize), (8, 4), (4, 2), (16, 2)] {
        let text = format!("#define GEMV_WARPS {warps}\n#define GEMV_UNROLL {unroll}\n{src}");
        let (ptx, _) = compile::ptx_for(&format!("gemv_w{warps}_u{unroll}"), &text, &arch)?;
        let module = gpu.ctx.load_module(ptx)?;
        let f = module.load_function("gemv_m1")?;
        // The build brook ships: mark the split it picks per shape.
        let shipped = warps == kernels::GEMV_WARPS && unroll == kernels::GEMV_UNROLL;
        for &(model, name, n, k) in &shapes {
            for split in [1u32, 2, 4, 8].into_iter().filter(|s| warps % s == 0) {
                let launch = |wp: u64| {
                    let p = kernels::GemvParams {
                        x: x.ptr(),
                        w: wp,
                        y: y.ptr(),
                        y32: 0,
                        m: 1,
                        n: n as i32,
                        k: k as i32,
                        split: split as i32,
                    };
                    let rows_per_cta = warps / split;
                    // SAFETY: w holds copies x [n, k], x [1, k], y [1, n].
                    unsafe {
                        gpu.launch_fn(
                            &f,
                            "gemv_m1",
                            ((n as u32).div_ceil(rows_per_cta), 1, 1),
                            (32 * warps, 1, 1),
                            &p,
                        )
                    }
                };
                let ms = time(&gpu, n, k, &launch)?;
                let auto = shipped && kernels::gemv_split(&gpu, k) == split as i32;
                let variant = format!("brook w{warps} u{unroll} s{split}");
                rate(model, name, &variant, n, k, auto, ms);
            }
        }
    }
    gpu.gemv_max_m = 0; // cuBLAS for every row count
    for &(model, name, n, k) in &shapes {
        let launch = |wp: u64| {
            // SAFETY: as above.
            unsafe { gemm::linear(&gpu, x.ptr(), wp, y.ptr(), 1, n, k, false) }
        };
        let ms = time(&gpu, n, k, &launch)?;
        rate(model, name, "cublas", n, k, false, ms);
    }
    Ok(())
}
