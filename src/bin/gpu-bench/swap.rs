//! `gpu-bench swap`: KV block copies between the device pool and the pinned host tier
//! (`executor::cuda::kv_tier`) for a model's KV shapes, against the copy ceiling: one
//! contiguous pinned copy of the same bytes. Batches of `n` blocks, consecutive ids and
//! scattered ids, each two ways: gathered (the default: one `kv_stage` gather or scatter
//! through a device staging buffer and one transfer per run of host blocks, `copies:
//! "gathered"`) and per plane (one copy per block and plane, `copies: "per_plane"`).

use std::time::Instant;

use brook::executor::backend::Backend;
use brook::executor::cuda::backend::kv_bytes_per_block;
use brook::model::synthetic::synthetic_config;
use brook::step::BlockCopy;
use cudarc::driver::result;

use crate::common::{backend, bench_options};

pub fn run(model: &str, host_gib: f64) -> anyhow::Result<()> {
    let cfg = synthetic_config(model)?;
    let mut opts = bench_options();
    let per_block = kv_bytes_per_block(&cfg, 16, opts.kv_cache_dtype);
    opts.host_kv_cache_bytes = (host_gib * (1u64 << 30) as f64) as usize;
    opts.max_kv_cache_bytes = Some(2048 * per_block);
    let mut b = backend(model, opts)?;
    let host_blocks = b.info().num_host_blocks;
    anyhow::ensure!(
        host_blocks >= 1024,
        "--host-gib too small: {host_blocks} blocks"
    );
    println!(
        "{}",
        serde_json::json!({"figure": "swap_startup_measure", "model": model,
            "bytes_per_block": per_block, "gb_s": b.copy_bytes_per_s() / 1e9})
    );
    for (gathered, copies) in [(false, "per_plane"), (true, "gathered")] {
        anyhow::ensure!(
            b.set_gathered_copies(gathered) == gathered,
            "no staging buffer: gathered copies unavailable"
        );
        sweep(&mut b, model, copies, per_block, host_blocks)?;
    }
    ceiling(&b, model, per_block)
}

/// Every batch size, consecutive and scattered ids, both directions, in the current mode.
fn sweep(
    b: &mut brook::executor::cuda::backend::CudaBackend,
    model: &str,
    copies: &str,
    per_block: usize,
    host_blocks: usize,
) -> anyhow::Result<()> {
    for n in [1usize, 8, 64, 256, 1024] {
        for scattered in [false, true] {
            // Scattered: every 2nd id on the device, every 3rd on the host.
            let ids = |i: usize, k: usize| (if scattered { i * k } else { i }) as u32;
            let out: Vec<BlockCopy> = (0..n)
                .map(|i| BlockCopy::to_host(ids(i, 2) % 2048, ids(i, 3) % host_blocks as u32))
                .collect();
            let back: Vec<BlockCopy> = out
                .iter()
                .map(|c| BlockCopy::to_device(c.dst, c.src))
                .collect();
            b.copy_blocks(&out)?;
            b.copy_blocks(&back)?;
            let reps = (4096 / n).clamp(3, 200);
            for (dir, list) in [("out", &out), ("in", &back)] {
                let t = Instant::now();
                for _ in 0..reps {
                    b.copy_blocks(list)?;
                }
                let s = t.elapsed().as_secs_f64() / reps as f64;
                println!(
                    "{}",
                    serde_json::json!({"figure": "swap", "model": model, "direction": dir,
                        "copies": copies, "blocks": n, "scattered": scattered,
                        "bytes": n * per_block,
                        "ms": s * 1e3, "gb_s": (n * per_block) as f64 / s / 1e9})
                );
            }
        }
    }
    Ok(())
}

/// The ceiling: one contiguous copy of 1024 blocks' bytes between the pool and pinned memory.
fn ceiling(
    b: &brook::executor::cuda::backend::CudaBackend,
    model: &str,
    per_block: usize,
) -> anyhow::Result<()> {
    let bytes = 1024 * per_block;
    let gpu = b.gpu();
    let mut pinned = unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }?;
    let ptr = pinned.as_mut_ptr()?;
    // SAFETY: `ptr .. + bytes` is the pinned allocation; synced before it is dropped.
    let host = unsafe { std::slice::from_raw_parts_mut(ptr, bytes) };
    let src = b.kv_layout().base;
    for dir in ["out", "in"] {
        let reps = 20;
        let t = Instant::now();
        for _ in 0..reps {
            let s = gpu.stream.cu_stream();
            unsafe {
                if dir == "out" {
                    result::memcpy_dtoh_async(host, src, s)?;
                } else {
                    result::memcpy_htod_async(src, host, s)?;
                }
            }
        }
        gpu.sync()?;
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{}",
            serde_json::json!({"figure": "swap_ceiling", "model": model, "direction": dir,
                "bytes": bytes, "ms": s * 1e3, "gb_s": bytes as f64 / s / 1e9})
        );
    }
    Ok(())
}
