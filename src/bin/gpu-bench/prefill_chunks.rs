//! `gpu-bench prefill-chunks`: one layer's flash prefill attention for one chunk of queries at
//! the end of a long context (the shapes chunked prefill of long documents runs), split over the
//! keys as `kernels::prefill_splits` chooses against unsplit, and at each forced split count;
//! unsplit also with the mma.sync kernel's synchronous K/V loads (`PF_LOADS=0`, the kernel before
//! cp.async) and with cp.async.cg, L2 only (`PF_LOADS=1`; the default is cp.async.ca). On Hopper
//! the engine's kernel is the wgmma one (`kernels::prefill_attn_kernel`); the mma.sync kernel is
//! timed beside it, unsplit and at the chosen splits.

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::kernels::{
    self, prefill_split_scratch, prefill_splits, PrefillAttnParams, PREFILL_TILE,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{
    emit, open_gpu, prefill_tma, random_bf16, read_bf16, rel_err, time_ms, upload, AttnShape,
};

const CONTEXTS: [usize; 3] = [2048, 8192, 16384];
const CHUNKS: [usize; 5] = [64, 128, 256, 512, 2048];
// 3, 6 and 12 too: with 3 CTAs an SM (session 15) the split rule needs retuning, and counts off
// the powers of two may fit a wave better.
const FORCED: [usize; 9] = [1, 2, 3, 4, 6, 8, 12, 16, 32];

/// Every (context, chunk) point at each model's head shape: µs and TFLOP/s unsplit, with the
/// chosen splits, and µs at each forced split count (what the split rule is tuned from).
pub fn run(models: &[String]) -> anyhow::Result<()> {
    let mut gpu = open_gpu()?;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for model in models {
        let shape = AttnShape::of_model(model)?;
        // The TMA build is timed beside the others whatever the engine's choice.
        gpu.prefill_tma = true;
        gpu.load_attention(shape.head_dim, shape.heads / shape.kv_heads)?;
        let mut variants = Variants {
            mma: [
                gpu.load_prefill_variant(shape.head_dim, 0)?,
                gpu.load_prefill_variant(shape.head_dim, 1)?,
                format!("prefill_attn_hd{}", shape.head_dim),
            ],
            wg_stages: Vec::new(),
            tma_piped: None,
        };
        // The wgmma kernel with 1 and 2 tiles of K and V, where it is built.
        for stages in [1, 2] {
            variants.wg_stages.extend(gpu.load_prefill_wg_variant(
                shape.head_dim,
                stages,
                false,
            )?);
        }
        // And the TMA build's pipelined loop (2 stages), timed with the tensor maps.
        variants.tma_piped = gpu.load_prefill_wg_variant(shape.head_dim, 2, true)?;
        let (acc, ml, counters) = prefill_split_scratch(gpu.num_sms, shape.head_dim);
        let scratch = Scratch {
            acc: gpu.alloc(acc * 4)?,
            ml: gpu.alloc(ml * 4)?,
            counters: upload(&gpu, &vec![0u32; counters])?,
            // Forced split counts go past what the rule allows, up to FORCED_CTAS_PER_SM.
            forced_ctas: FORCED_CTAS_PER_SM * gpu.num_sms as usize,
            forced_acc: gpu.alloc(
                FORCED_CTAS_PER_SM * gpu.num_sms as usize * PREFILL_TILE * shape.head_dim * 4,
            )?,
            forced_ml: gpu
                .alloc(FORCED_CTAS_PER_SM * gpu.num_sms as usize * PREFILL_TILE * 2 * 4)?,
            forced_counters: upload(&gpu, &vec![0u32; CHUNKS[4] / PREFILL_TILE * shape.heads])?,
        };
        let mut rows = Vec::new();
        for ctx in CONTEXTS {
            for chunk in CHUNKS.into_iter().filter(|&c| c <= ctx) {
                rows.push(point(
                    &gpu, &shape, &scratch, &variants, ctx, chunk, &mut rng,
                )?);
            }
        }
        emit(
            json!({"figure": "prefill_chunk_attention", "model": model, "heads": shape.heads,
            "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "num_sms": gpu.num_sms, "rows": rows}),
        );
    }
    Ok(())
}

/// The kernels timed beside the engine's: the mma.sync kernel with synchronous and cp.async.cg
/// loads and as built (`mma`), and the wgmma kernel's builds by K/V stages (`wg_stages`, Hopper
/// only).
struct Variants {
    mma: [String; 3],
    wg_stages: Vec<String>,
    /// The TMA build with 2 stages (`Gpu::load_prefill_wg_variant`).
    tma_piped: Option<String>,
}

/// Split CTAs per SM that the forced split counts may use (their scratch).
const FORCED_CTAS_PER_SM: usize = 8;

struct Scratch {
    forced_ctas: usize,
    acc: DevBuf,
    ml: DevBuf,
    counters: DevBuf,
    forced_acc: DevBuf,
    forced_ml: DevBuf,
    forced_counters: DevBuf,
}

/// One chunk of `chunk` queries at positions ctx - chunk .. ctx of one sequence.
fn point(
    gpu: &Gpu,
    shape: &AttnShape,
    scratch: &Scratch,
    variants: &Variants,
    ctx: usize,
    chunk: usize,
    rng: &mut ChaCha8Rng,
) -> anyhow::Result<serde_json::Value> {
    let (h, kvh, hd, bs) = (
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
        shape.block_size,
    );
    let blocks = ctx.div_ceil(bs);
    let k_cache = random_bf16(gpu, blocks * kvh * bs * hd, 41)?;
    let v_cache = random_bf16(gpu, blocks * kvh * bs * hd, 42)?;
    let q = random_bf16(gpu, chunk * h * hd, 43)?;
    let mut table: Vec<i32> = (0..blocks as i32).collect();
    table.shuffle(rng);
    let tiles = chunk.div_ceil(PREFILL_TILE);
    let tile_seq = upload(gpu, &vec![0i32; tiles])?;
    let q0: Vec<i32> = (0..tiles).map(|t| (t * PREFILL_TILE) as i32).collect();
    let tile_q0 = upload(gpu, &q0)?;
    let (q_start, q_len, ctx_len) = (
        upload(gpu, &[0i32])?,
        upload(gpu, &[chunk as i32])?,
        upload(gpu, &[ctx as i32])?,
    );
    let block_tables = upload(gpu, &table)?;
    let out = gpu.alloc(chunk * h * hd * 2)?;
    // The TMA build's tensor maps of these caches; the engine's kernel when BROOK_PREFILL_TMA.
    let tma = kernels::prefill_tma_kernel(gpu, hd);
    let maps = match gpu.has_function(&tma) {
        true => {
            let caches = [(k_cache.ptr(), v_cache.ptr())];
            Some(kernels::kv_tensor_maps(gpu, &caches, blocks, kvh, bs, hd)?)
        }
        false => None,
    };
    let maps_ptr = maps.as_ref().map_or(0, |m| m.ptr());
    let engine_maps = if prefill_tma() { maps_ptr } else { 0 };
    let params = |splits: usize, forced: bool| PrefillAttnParams {
        q: q.ptr(),
        k_cache: k_cache.ptr(),
        v_cache: v_cache.ptr(),
        tile_seq: tile_seq.ptr(),
        tile_q0: tile_q0.ptr(),
        q_start: q_start.ptr(),
        q_len: q_len.ptr(),
        context_lens: ctx_len.ptr(),
        block_tables: block_tables.ptr(),
        out: out.ptr(),
        part_acc: if forced {
            scratch.forced_acc.ptr()
        } else {
            scratch.acc.ptr()
        },
        part_ml: if forced {
            scratch.forced_ml.ptr()
        } else {
            scratch.ml.ptr()
        },
        counters: if forced {
            scratch.forced_counters.ptr()
        } else {
            scratch.counters.ptr()
        },
        num_tiles: tiles as i32,
        num_heads: h as i32,
        num_kv_heads: kvh as i32,
        block_size: bs as i32,
        max_blocks: blocks as i32,
        window: 0,
        num_splits: splits as i32,
        scale: shape.scale(),
        kv_maps: engine_maps,
    };
    // Query i sees ctx - chunk + i + 1 keys.
    let pairs = chunk * (ctx - chunk) + chunk * (chunk + 1) / 2;
    let flops = 4.0 * (h * hd) as f64 * pairs as f64;
    let reps = if chunk * ctx <= 512 * 8192 { 50 } else { 20 };
    let default = match engine_maps {
        0 => kernels::prefill_attn_kernel(gpu, hd)?,
        _ => tma.clone(),
    };
    let run_named = |p: PrefillAttnParams, name: &str| -> anyhow::Result<(f64, Vec<f32>)> {
        // SAFETY: every buffer above matches the shapes in the params.
        let ms = time_ms(gpu, 3, reps, |_| unsafe {
            kernels::prefill_attn_named(gpu, &p, name)
        })?;
        gpu.memset(out.ptr(), 0xff, chunk * h * hd * 2)?;
        // SAFETY: as above.
        unsafe { kernels::prefill_attn_named(gpu, &p, name)? };
        Ok((ms * 1e3, read_bf16(gpu, &out, chunk * h * hd)?))
    };
    let run = |p: PrefillAttnParams| run_named(p, &default);
    let (off_us, reference) = run(params(1, false))?;
    let mut loads_us = Vec::new();
    for name in &variants.mma {
        let (us, got) = run_named(params(1, false), name)?;
        let err = rel_err(&got, &reference);
        anyhow::ensure!(
            err < 1e-2,
            "ctx {ctx} chunk {chunk}: {name} differs by {err:.3e}"
        );
        loads_us.push(us);
    }
    let chosen = prefill_splits(gpu.num_sms, tiles, h, ctx);
    let (on_us, got) = run(params(chosen, false))?;
    let err = rel_err(&got, &reference);
    anyhow::ensure!(
        err < 1e-2,
        "ctx {ctx} chunk {chunk}: {chosen} splits differ from unsplit by {err:.3e}"
    );
    let (mma_split_us, got) = run_named(params(chosen, false), &variants.mma[2])?;
    let err_mma = rel_err(&got, &reference);
    anyhow::ensure!(
        err_mma < 1e-2,
        "ctx {ctx} chunk {chunk}: mma.sync at {chosen} splits differs by {err_mma:.3e}"
    );
    let mut stages_us = serde_json::Map::new();
    for name in &variants.wg_stages {
        let (us, got) = run_named(params(chosen, false), name)?;
        let err = rel_err(&got, &reference);
        anyhow::ensure!(
            err < 1e-2,
            "ctx {ctx} chunk {chunk}: {name} differs by {err:.3e}"
        );
        stages_us.insert(name.clone(), json!(us));
    }
    let tma_builds = std::iter::once(&tma).chain(variants.tma_piped.as_ref());
    for name in tma_builds.filter(|_| maps_ptr != 0) {
        let p = PrefillAttnParams {
            kv_maps: maps_ptr,
            ..params(chosen, false)
        };
        let (us, got) = run_named(p, name)?;
        let err = rel_err(&got, &reference);
        anyhow::ensure!(
            err < 1e-2,
            "ctx {ctx} chunk {chunk}: {name} differs by {err:.3e}"
        );
        stages_us.insert(name.clone(), json!(us));
    }
    let mut forced = serde_json::Map::new();
    for s in FORCED
        .into_iter()
        .filter(|&s| s > 1 && tiles * h * s <= scratch.forced_ctas)
    {
        let (us, got) = run(params(s, true))?;
        let err = rel_err(&got, &reference);
        anyhow::ensure!(
            err < 1e-2,
            "ctx {ctx} chunk {chunk}: {s} forced splits differ by {err:.3e}"
        );
        forced.insert(s.to_string(), json!(us));
    }
    let tf = |us: f64| flops / (us * 1e-6) / 1e12;
    eprintln!(
        "prefill chunk {chunk:>4} at ctx {ctx:>5}: {default} unsplit {off_us:8.1} µs ({:5.1} TFLOP/s), {chosen:>2} splits {on_us:8.1} µs ({:5.1} TFLOP/s); mma.sync {:8.1} / {mma_split_us:8.1} µs, wgmma by stages {}, its sync loads {:8.1}, cg {:8.1}; x{:.2} vs sync; forced {}",
        tf(off_us),
        tf(on_us),
        loads_us[2],
        serde_json::Value::Object(stages_us.clone()),
        loads_us[0],
        loads_us[1],
        loads_us[0] / on_us,
        serde_json::Value::Object(forced.clone())
    );
    Ok(
        json!({"ctx": ctx, "chunk": chunk, "tiles": tiles, "splits": chosen, "kernel": default,
        "mma_sync_us": loads_us[2], "mma_sync_split_us": mma_split_us, "wg_stages_split_us": stages_us, "sync_loads_us": loads_us[0], "cg_loads_us": loads_us[1], "unsplit_us": off_us, "split_us": on_us, "unsplit_tflops": tf(off_us), "split_tflops": tf(on_us),
        "speedup": off_us / on_us, "rel_err": err, "forced_us": forced}),
    )
}
