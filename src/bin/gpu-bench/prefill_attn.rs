//! `gpu-bench prefill-attn`: one layer's prefill attention on the GEMM path and on the flash
//! kernel by prompt length and batch, and the length from which the flash kernel wins.

use anyhow::Context;
use brook::executor::cuda::device::Gpu;
use brook::executor::cuda::kernels::{self, scores_ld};
use brook::executor::cuda::prefill_gemm::{gemm_attention, GemmAttention, GemmPlanner, GemmSeq};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{emit, open_gpu, time_ms, upload, AttnShape, CausalPrefill};

/// Prefill attention of one layer at a model's head shape, `batch` prompts of `len` tokens (no
/// cached prefix), on the GEMM path (gather + S GEMMs + causal softmax + P·V GEMMs, all it costs)
/// and on the flash kernel, timed with CUDA events (median of many runs). Each point also
/// checks that the two outputs agree.
pub fn run(models: &[String]) -> anyhow::Result<()> {
    let mut gpu = open_gpu()?;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    const LENS: [usize; 8] = [16, 32, 64, 128, 256, 512, 1024, 2048];
    for model in models {
        let shape = AttnShape::of_model(model)?;
        gpu.load_attention(shape.head_dim, shape.heads / shape.kv_heads)?;
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

/// (GEMM path µs, flash µs, relative difference of their outputs) for one point.
fn prefill_attn_point(
    gpu: &Gpu,
    shape: &AttnShape,
    batch: usize,
    len: usize,
    rng: &mut ChaCha8Rng,
) -> anyhow::Result<(f64, f64, f64)> {
    let (h, hd) = (shape.heads, shape.head_dim);
    let t = batch * len;
    let num_blocks = batch * len.div_ceil(shape.block_size);
    let prompts = CausalPrefill::new(gpu, shape, (batch, len), num_blocks, 31, rng)?;
    let (out_gemm, out_flash) = (gpu.alloc(t * h * hd * 2)?, gpu.alloc(t * h * hd * 2)?);
    let mut planner = GemmPlanner::new(usize::MAX, h, usize::MAX, usize::MAX);
    let seqs: Vec<GemmSeq> = (0..batch)
        .map(|s| {
            planner
                .place(s, s * len, len, len)
                .context("unbounded planner")
        })
        .collect::<anyhow::Result<_>>()?;
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
    let (gemm_seq, gemm_key0, gemm_s0) = (
        upload(gpu, &col(|s| s.seq))?,
        upload(gpu, &col(|s| s.key0))?,
        upload(gpu, &col(|s| s.s0))?,
    );
    let flash = prompts.flash_params(shape, &out_flash);
    let gemm = GemmAttention {
        q: prompts.q.ptr(),
        out: out_gemm.ptr(),
        k_cache: prompts.k_cache.ptr(),
        v_cache: prompts.v_cache.ptr(),
        q_lens: prompts.lens.ptr(),
        context_lens: prompts.lens.ptr(),
        block_tables: prompts.block_tables.ptr(),
        gemm_seq: gemm_seq.ptr(),
        gemm_key0: gemm_key0.ptr(),
        gemm_s0: gemm_s0.ptr(),
        k_buf: k_buf.ptr(),
        v_buf: v_buf.ptr(),
        scores: scores.ptr(),
        seqs: &seqs,
        num_heads: h,
        num_kv_heads: shape.kv_heads,
        head_dim: hd,
        block_size: shape.block_size,
        max_blocks: prompts.blocks_per_seq,
        scale: shape.scale(),
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
