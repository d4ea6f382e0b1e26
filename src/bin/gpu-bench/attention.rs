//! `gpu-bench attention`: paged decode attention GB/s by context and batch, for each split rule
//! and merge (`DecodeVariant`), then the flash prefill kernel's TFLOP/s on causal prompts.

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::kernels::{
    self, decode_cluster_supported, decode_group_ctas_for, decode_splits_filled, PagedDecodeParams,
    DECODE_CLUSTER_MAX,
};
use brook::executor::cuda::{decode_split_rule, DecodeKernel, KvCacheDtype};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{
    bench_options, block_size, emit, kv_elem_bytes, open_gpu, random_bf16, random_kv, read_bf16,
    rel_err, time_ms, time_ms_back_to_back, upload, AttnShape, CausalPrefill,
};
use crate::spin::Spin;

/// Paged decode attention at each of `shapes` (heads/kv_heads/head_dim; `default_shapes`), one
/// layer, on both decode kernels; bytes = K and V read once + Q + output. Several disjoint
/// caches are rotated so small cases are not served from L2. Each launch is timed lone (host
/// latency in it), 8 back to back, and queued behind a spin (alone, without the host's
/// latency), beside a memcpy of the same bytes timed the same three ways (`copy_floor`). Then
/// the flash prefill kernel's rate on causal prompts (unless `decode_only`).
pub fn run(
    decode_only: bool,
    dtypes: &[KvCacheDtype],
    shapes: &[String],
    filter: &DecodeFilter,
) -> anyhow::Result<()> {
    let shapes = shapes
        .iter()
        .map(|s| parse_shape(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut gpu = open_gpu()?;
    for &dtype in dtypes {
        // Kernels for this cache dtype (e4m3: the -DKV_FP8 builds) and caches filled in it.
        gpu.set_kv_fp8(dtype.is_fp8())?;
        for &(heads, kv_heads, head_dim) in &shapes {
            let shape = AttnShape {
                heads,
                kv_heads,
                head_dim,
                block_size: block_size(),
            };
            gpu.load_attention(head_dim, heads / kv_heads)?;
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            paged_decode(&gpu, &shape, &mut rng, dtype, filter)?;
            if !decode_only {
                prefill(&mut gpu, &shape, &mut rng, dtype)?;
            }
        }
    }
    Ok(())
}

/// `--shapes`' default: Llama-2-7B (MHA, head_dim 128) first, as before; then Llama-3-8B's 4
/// and Qwen2.5-7B's 7 query heads per kv head, and Phi-3-mini's head_dim 96.
pub fn default_shapes() -> Vec<String> {
    ["32/32/128", "32/8/128", "28/4/128", "32/32/96"]
        .map(String::from)
        .to_vec()
}

/// Which decode variants and (ctx, batch) cases run; empty: all.
#[derive(Debug)]
pub struct DecodeFilter {
    variants: Vec<String>,
    cases: Vec<(usize, usize)>,
}

impl DecodeFilter {
    /// Variant names (each must exist) and "ctx/batch" cases.
    pub fn parse(variants: &[String], cases: &[String]) -> anyhow::Result<DecodeFilter> {
        for v in variants {
            anyhow::ensure!(
                v == SERVING || DECODE_VARIANTS.iter().any(|d| d.name == v),
                "no decode variant {v:?}"
            );
        }
        let cases = cases
            .iter()
            .map(|c| {
                let (ctx, batch) = c
                    .split_once('/')
                    .ok_or_else(|| anyhow::anyhow!("case {c:?}: want ctx/batch"))?;
                Ok((ctx.parse()?, batch.parse()?))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(DecodeFilter {
            variants: variants.to_vec(),
            cases,
        })
    }

    fn variant(&self, name: &str) -> bool {
        self.variants.is_empty() || self.variants.iter().any(|v| v == name)
    }

    /// The (ctx, batch) cases asked for, any shape; by default the grid of 1k/4k/16k keys by
    /// batch 1/16/64/256.
    fn cases(&self) -> Vec<(usize, usize)> {
        match self.cases.is_empty() {
            false => self.cases.clone(),
            true => [1024usize, 4096, 16384]
                .iter()
                .flat_map(|&ctx| [1usize, 16, 64, 256].map(|batch| (ctx, batch)))
                .collect(),
        }
    }
}

/// "heads/kv_heads/head_dim" as numbers; kv_heads must divide heads.
fn parse_shape(s: &str) -> anyhow::Result<(usize, usize, usize)> {
    let n: Vec<usize> = s
        .split('/')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("shape {s:?}: {e}"))?;
    match n[..] {
        [h, kvh, hd] if kvh > 0 && h % kvh == 0 => Ok((h, kvh, hd)),
        _ => anyhow::bail!("shape {s:?}: want heads/kv_heads/head_dim, kv_heads dividing heads"),
    }
}

/// A decode split rule, merge and kernel, as `CudaBackendOptions::decode_ctas_per_sm`,
/// `decode_merge_inline` and `decode_kernel` choose them.
struct DecodeVariant {
    name: &'static str,
    /// 0: `kernels::decode_splits` (the default); else `decode_splits_filled` with this many.
    ctas_per_sm: usize,
    inline: bool,
    kernel: DecodeKernel,
    /// `decode_splits_filled`'s fewest keys a split (the serving rule:
    /// `kernels::decode_min_split_keys`).
    min_keys: usize,
    /// Splits merged in a thread-block cluster (`CudaBackendOptions::decode_cluster`; at most
    /// `DECODE_CLUSTER_MAX` splits).
    cluster: bool,
}

const DECODE_VARIANTS: &[DecodeVariant] = &[
    DecodeVariant {
        name: "default",
        ctas_per_sm: 0,
        inline: false,
        kernel: DecodeKernel::Lanes,
        min_keys: 32,
        cluster: false,
    },
    DecodeVariant {
        name: "inline",
        ctas_per_sm: 0,
        inline: true,
        kernel: DecodeKernel::Lanes,
        min_keys: 32,
        cluster: false,
    },
    DecodeVariant {
        name: "fill4",
        ctas_per_sm: 4,
        inline: false,
        kernel: DecodeKernel::Lanes,
        min_keys: 32,
        cluster: false,
    },
    DecodeVariant {
        name: "fill4-inline",
        ctas_per_sm: 4,
        inline: true,
        kernel: DecodeKernel::Lanes,
        min_keys: 32,
        cluster: false,
    },
    DecodeVariant {
        name: "fill8-inline",
        ctas_per_sm: 8,
        inline: true,
        kernel: DecodeKernel::Lanes,
        min_keys: 32,
        cluster: false,
    },
    // The tensor-core kernel (paged_decode_mma.cu) at the lane kernel's serving fill (8) and at
    // the fills the backend uses for it (`forward::decode_fill`: 4 with a bf16 cache, 6 with
    // e4m3), all with the inline merge.
    DecodeVariant {
        name: "fill8-inline-mma",
        ctas_per_sm: 8,
        inline: true,
        kernel: DecodeKernel::Mma,
        min_keys: 32,
        cluster: false,
    },
    DecodeVariant {
        name: "fill4-inline-mma",
        ctas_per_sm: 4,
        inline: true,
        kernel: DecodeKernel::Mma,
        min_keys: 32,
        cluster: false,
    },
    DecodeVariant {
        name: "fill6-inline-mma",
        ctas_per_sm: 6,
        inline: true,
        kernel: DecodeKernel::Mma,
        min_keys: 32,
        cluster: false,
    },
    // At least 128 keys a split: the serving rule on tensor cores from 1k keys of context
    // (`kernels::decode_min_split_keys`, session 18).
    DecodeVariant {
        name: "fill4-k128-inline-mma",
        ctas_per_sm: 4,
        inline: true,
        kernel: DecodeKernel::Mma,
        min_keys: 128,
        cluster: false,
    },
    DecodeVariant {
        name: "fill6-k128-inline-mma",
        ctas_per_sm: 6,
        inline: true,
        kernel: DecodeKernel::Mma,
        min_keys: 128,
        cluster: false,
    },
    // Splits merged in a cluster (the serving rules above, capped at 16 splits).
    DecodeVariant {
        name: "fill8-cluster",
        ctas_per_sm: 8,
        inline: false,
        kernel: DecodeKernel::Lanes,
        min_keys: 32,
        cluster: true,
    },
    DecodeVariant {
        name: "fill4-cluster-mma",
        ctas_per_sm: 4,
        inline: false,
        kernel: DecodeKernel::Mma,
        min_keys: 32,
        cluster: true,
    },
    DecodeVariant {
        name: "fill4-k128-cluster-mma",
        ctas_per_sm: 4,
        inline: false,
        kernel: DecodeKernel::Mma,
        min_keys: 128,
        cluster: true,
    },
];

/// The variant that runs what serving runs at each case (`decode_split_rule` under the bench's
/// options, and its merge).
const SERVING: &str = "serving";

/// A decode variant resolved at one case: the kernel, merge and splits its launches run.
struct Plan {
    name: &'static str,
    kernel: DecodeKernel,
    inline: bool,
    splits: usize,
    cluster: bool,
}

fn paged_decode(
    gpu: &Gpu,
    shape: &AttnShape,
    rng: &mut ChaCha8Rng,
    dtype: KvCacheDtype,
    filter: &DecodeFilter,
) -> anyhow::Result<()> {
    let (h, kvh, hd, bs) = (
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
        shape.block_size,
    );
    let kv = dtype.as_str();
    let spin = Spin::new(gpu)?;
    let opts = bench_options();
    let serving = decode_split_rule(gpu, &opts, hd, h, kvh)?;
    let serving_inline = opts.decode_merge_inline;
    let mut rows = Vec::new();
    for (ctx, batch) in filter.cases() {
        let blocks_per_seq = ctx.div_ceil(bs);
        let kv_bytes = batch * ctx * kvh * hd * 2 * kv_elem_bytes(gpu);
        // Large batches only where one copy of their cache stays under 16 GiB.
        if kv_bytes > 16 << 30 {
            continue;
        }
        let sets = (512usize << 20).div_ceil(kv_bytes).clamp(1, 8);
        let num_blocks = sets * batch * blocks_per_seq;
        let cache_elems = num_blocks * kvh * bs * hd;
        let (k, v) = (
            random_kv(gpu, cache_elems, 11)?,
            random_kv(gpu, cache_elems, 12)?,
        );
        let q = random_bf16(gpu, batch * h * hd, 13)?;
        let out = gpu.alloc(batch * h * hd * 2)?;
        let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
        perm.shuffle(rng);
        let tables: Vec<DevBuf> = perm
            .chunks(batch * blocks_per_seq)
            .map(|c| upload(gpu, c))
            .collect::<anyhow::Result<_>>()?;
        let rows_idx: Vec<i32> = (0..batch as i32).collect();
        let (item_row, ctx_lens) = (
            upload(gpu, &rows_idx)?,
            upload(gpu, &vec![ctx as i32; batch])?,
        );
        let group = h / kvh;
        let splits_of = |v: &DecodeVariant| {
            let s = match v.ctas_per_sm {
                0 => kernels::decode_splits(gpu.num_sms, batch, kvh, ctx),
                c => decode_splits_filled(gpu.num_sms, c, batch, kvh, group, ctx, v.min_keys),
            };
            match v.cluster {
                true => s.min(DECODE_CLUSTER_MAX),
                false => s,
            }
        };
        // What each variant asked for runs at this case, then what serving runs ("serving":
        // the backend's own rule and merge under the bench's options).
        let mut plans: Vec<Plan> = DECODE_VARIANTS
            .iter()
            .filter(|v| filter.variant(v.name) && (!v.cluster || decode_cluster_supported(gpu)))
            .map(|v| Plan {
                name: v.name,
                kernel: v.kernel,
                inline: v.inline,
                splits: splits_of(v),
                cluster: v.cluster,
            })
            .collect();
        if filter.variant(SERVING) {
            let (splits, cluster) = serving.splits(batch, ctx);
            plans.push(Plan {
                name: SERVING,
                kernel: serving.kernel,
                inline: serving_inline,
                splits,
                cluster,
            });
        }
        let most = plans.iter().map(|p| p.splits).max().unwrap_or(1);
        let (part_acc, part_ml) = (
            gpu.alloc(batch * h * most * hd * 4)?,
            gpu.alloc(batch * h * most * 2 * 4)?,
        );
        let num_counters = batch * kvh * decode_group_ctas_for(group, gpu.kv_fp8());
        let counters = gpu.alloc(num_counters * 4)?;
        gpu.memset(counters.ptr(), 0, num_counters * 4)?;
        // Each variant's output against the default's on the same inputs (the last set).
        let mut reference: Option<Vec<f32>> = None;
        for var in &plans {
            let splits = var.splits;
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
                counters: if var.inline { counters.ptr() } else { 0 },
                num_items: batch as i32,
                num_heads: h as i32,
                num_kv_heads: kvh as i32,
                block_size: bs as i32,
                max_blocks: blocks_per_seq as i32,
                num_splits: splits as i32,
                window: 0,
                scale: shape.scale(),
            };
            // SAFETY: every buffer above matches the shapes in the params.
            let ms = time_ms(gpu, 3, 20, |i| unsafe {
                kernels::paged_decode(gpu, &params(i % sets), hd, var.kernel, var.cluster)
            })?;
            // The same launches 8 at a time (each on the next set of K/V): the kernel's own
            // time, without a lone launch's latency on an idle GPU.
            // SAFETY: as above.
            let ms_b2b = time_ms_back_to_back(gpu, 1, 10, 8, |i| unsafe {
                kernels::paged_decode(gpu, &params(i % sets), hd, var.kernel, var.cluster)
            })?;
            // One launch queued behind a spin: alone on the GPU, without the host's latency.
            // SAFETY: as above.
            let ms_q = spin.time_queued_ms(gpu, 1, 20, |i| unsafe {
                kernels::paged_decode(gpu, &params(i % sets), hd, var.kernel, var.cluster)
            })?;
            gpu.memset(out.ptr(), 0xff, batch * h * hd * 2)?;
            // SAFETY: as above.
            unsafe { kernels::paged_decode(gpu, &params(sets - 1), hd, var.kernel, var.cluster)? };
            let got = read_bf16(gpu, &out, batch * h * hd)?;
            let err = match &reference {
                None => 0.0,
                Some(r) => rel_err(&got, r),
            };
            reference.get_or_insert(got);
            let bytes = kv_bytes + 2 * batch * h * hd * 2;
            let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
            let gbps_b2b = bytes as f64 / (ms_b2b * 1e-3) / 1e9;
            let pct = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9 / 43.0;
            eprintln!(
            "paged decode {:<16} h{h}/{kvh} kv {kv} ctx {ctx:>5} batch {batch:>3}: {ms:.4} ms, {gbps:.0} GB/s ({:.0}% of 4300); back to back {ms_b2b:.4} ms ({:.0}%); queued {ms_q:.4} ms ({:.0}%); {splits} splits{}, rel. err. vs default {err:.1e}",
            var.name,
            gbps / 43.0,
            gbps_b2b / 43.0,
            pct(ms_q),
            if var.cluster { " in a cluster" } else { "" }
        );
            anyhow::ensure!(
                err < 1e-2,
                "{}: output differs from the default's by {err:.3e}",
                var.name
            );
            rows.push(json!({"variant": var.name, "kernel": kernels::decode_kernel(var.kernel, hd, group, gpu.kv_fp8()).as_str(), "kv_cache_dtype": kv, "ctx": ctx, "batch": batch, "ms": ms, "gbps": gbps, "pct_of_4300": gbps / 43.0, "ms_back_to_back": ms_b2b, "pct_of_4300_back_to_back": gbps_b2b / 43.0, "ms_queued": ms_q, "pct_of_4300_queued": pct(ms_q), "splits": splits, "cluster": var.cluster, "rel_err_vs_default": err}));
        }
        rows.push(copy_floor(
            gpu,
            &spin,
            &k,
            &v,
            kv_bytes,
            (h, kvh, kv, ctx, batch),
        )?);
    }
    emit(
        json!({"figure": "paged_decode_attention", "kv_cache_dtype": kv, "heads": h, "kv_heads": kvh, "head_dim": hd, "block_size": bs, "rows": rows}),
    );
    Ok(())
}

/// The copy floor of one case: a device-to-device memcpy moving the case's K/V bytes (its K bytes
/// read from `k`, written to `v`), lone, 8 back to back and queued behind the spin, each on the
/// next slice of the buffers so L2 does not serve it. What the goal's "% of copy bandwidth" can
/// reach in a launch of that size, ramp and tail included. Runs after the variants: it
/// overwrites `v`.
fn copy_floor(
    gpu: &Gpu,
    spin: &Spin,
    k: &DevBuf,
    v: &DevBuf,
    kv_bytes: usize,
    (h, kvh, kv, ctx, batch): (usize, usize, &str, usize, usize),
) -> anyhow::Result<serde_json::Value> {
    let half = kv_bytes / 2;
    let slices = (k.bytes() / half).max(1);
    // SAFETY: both slices lie inside their buffers (each at least `slices * half` bytes), and
    // `k` and `v` are separate allocations.
    let copy = |i: usize| unsafe {
        let (from, to) = ((i % slices) * half, ((i + 1) % slices) * half);
        gpu.copy_dtod(v.ptr() + to as u64, k.ptr() + from as u64, half)
    };
    let ms = time_ms(gpu, 3, 20, copy)?;
    let ms_b2b = time_ms_back_to_back(gpu, 1, 10, 8, copy)?;
    let ms_q = spin.time_queued_ms(gpu, 1, 20, copy)?;
    let pct = |ms: f64| kv_bytes as f64 / (ms * 1e-3) / 1e9 / 43.0;
    eprintln!(
        "copy floor (memcpy, same bytes) h{h}/{kvh} kv {kv} ctx {ctx:>5} batch {batch:>3}: {ms:.4} ms ({:.0}% of 4300); back to back {ms_b2b:.4} ms ({:.0}%); queued {ms_q:.4} ms ({:.0}%)",
        pct(ms),
        pct(ms_b2b),
        pct(ms_q)
    );
    Ok(
        json!({"variant": "copy-floor", "kv_cache_dtype": kv, "ctx": ctx, "batch": batch, "ms": ms, "pct_of_4300": pct(ms), "ms_back_to_back": ms_b2b, "pct_of_4300_back_to_back": pct(ms_b2b), "ms_queued": ms_q, "pct_of_4300_queued": pct(ms_q)}),
    )
}

/// The engine's prefill kernel (`kernels::prefill_attn_kernel`: wgmma on Hopper) on 16k tokens of
/// causal prompts of each length; at the same points the mma.sync kernel and its builds with the
/// synchronous K/V loads of the kernel before cp.async (`PF_LOADS=0`) and with cp.async.cg, L2
/// only (`PF_LOADS=1`; the default is cp.async.ca).
fn prefill(
    gpu: &mut Gpu,
    shape: &AttnShape,
    rng: &mut ChaCha8Rng,
    dtype: KvCacheDtype,
) -> anyhow::Result<()> {
    let (h, hd) = (shape.heads, shape.head_dim);
    let variants = [
        gpu.load_prefill_variant(hd, 0)?,
        gpu.load_prefill_variant(hd, 1)?,
        gpu.kv_kernel(&format!("prefill_attn_hd{hd}")),
    ];
    let gpu = &*gpu;
    let kernel = kernels::prefill_attn_kernel(gpu, hd)?;
    let mut prefill_rows = Vec::new();
    for &len in &[128usize, 512, 2048, 8192] {
        let seqs = (16384 / len).max(1);
        let num_blocks = (seqs * len).div_ceil(shape.block_size) + seqs;
        let batch = CausalPrefill::new(gpu, shape, (seqs, len), num_blocks, 21, rng)?;
        let out = gpu.alloc(batch.tokens() * h * hd * 2)?;
        let p = batch.flash_params(shape, &out);
        // SAFETY: buffers match the params' shapes.
        let ms = time_ms(gpu, 2, 10, |_| unsafe {
            kernels::prefill_attn(gpu, &p, hd)
        })?;
        // Causal: QK^T and PV over len (len + 1) / 2 key-query pairs per head.
        let flops = 4.0 * (seqs * h * hd) as f64 * (len * (len + 1) / 2) as f64;
        let tflops = flops / (ms * 1e-3) / 1e12;
        let mut other = Vec::new();
        for name in &variants {
            // SAFETY: as above.
            other.push(time_ms(gpu, 2, 10, |_| unsafe {
                kernels::prefill_attn_named(gpu, &p, name)
            })?);
        }
        eprintln!(
            "prefill attention {kernel} kv {} {seqs} x {len}: {ms:.3} ms, {tflops:.0} TFLOP/s (mma.sync {:.3} ms, {:.0} TFLOP/s; its sync loads {:.3} ms, cp.async.cg {:.3} ms)",
            dtype.as_str(),
            other[2],
            flops / (other[2] * 1e-3) / 1e12,
            other[0],
            other[1]
        );
        prefill_rows.push(
            json!({"seq_len": len, "seqs": seqs, "kernel": kernel, "ms": ms, "tflops": tflops,
            "mma_sync_ms": other[2], "sync_loads_ms": other[0], "cg_loads_ms": other[1]}),
        );
    }
    emit(
        json!({"figure": "prefill_attention", "kv_cache_dtype": dtype.as_str(), "heads": h, "head_dim": hd, "rows": prefill_rows}),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--variants` takes the table's names and "serving"; anything else is refused up front
    /// (a typo must not cost a device call an empty run).
    #[test]
    fn variant_names_are_checked() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let f = DecodeFilter::parse(&names(&["default", SERVING]), &[]).unwrap();
        assert!(f.variant("default") && f.variant(SERVING) && !f.variant("fill8-inline"));
        let e = DecodeFilter::parse(&names(&["servng"]), &[]).unwrap_err();
        assert!(e.to_string().contains("servng"), "{e}");
        assert!(DecodeFilter::parse(&[], &[]).unwrap().variant(SERVING));
    }
}
