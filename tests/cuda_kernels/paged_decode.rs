//! `paged_decode`: one query row per sequence over its paged context, split-k or not, for every
//! head size and GQA group the model families use, with and without a sliding window; the
//! splits merged by `paged_decode_reduce` or inside the kernel (arrival counters), and the split
//! rule that fills the GPU at batch 1 (`decode_splits_filled`); and all of it again over an
//! e4m3 cache (`fp8`: 16 elements a lane, at most 4 query heads a CTA); and the splits merged in
//! a thread-block cluster (sm_90). Every case runs on both
//! decode kernels: the lane kernel and, where the head dim has one, the tensor-core kernel
//! (paged_decode_mma.cu: head dims up to 128, the group's heads as the mma's columns, 8 a CTA;
//! 16-key steps sharing one block-table entry from blocks of 16 keys up).

use brook::executor::cuda::kernels::{
    self, decode_cluster_supported, decode_group_ctas_for, decode_min_split_keys,
    decode_mma_supported, decode_splits, decode_splits_filled, PagedDecodeParams,
    DECODE_CLUSTER_MAX,
};
use brook::executor::cuda::DecodeKernel;
use half::bf16;
use rand::seq::SliceRandom;

use crate::harness::{
    assert_close, attention_gpu_tuned, dev, poisoned, rand_bf16, read, read_bf16, rng, to_f32,
};
use crate::paged::{KvLayout, Paged};

/// One decode launch; each test overrides the knobs it is about.
#[derive(Clone)]
struct Decode {
    seed: u64,
    head_dim: usize,
    heads: usize,
    kv_heads: usize,
    /// Context of each sequence (odd lengths, not multiples of the block size).
    ctx: Vec<usize>,
    /// None: what the backend would choose.
    splits: Option<usize>,
    /// Sliding window; 0: none. Blocks wholly before each window are freed (-1).
    window: usize,
    /// Merge the splits inside the decode kernel (`counters` set) instead of in
    /// `paged_decode_reduce`; the launch then runs twice, so the counters must be back at zero.
    inline: bool,
    /// With `splits` None: `decode_splits_filled` with this many CTAs per SM (0: `decode_splits`).
    ctas_per_sm: usize,
    /// An e4m3 cache (the `-DKV_FP8` kernel); the reference reads the same quantized values.
    fp8: bool,
    /// Keys a block (a power of two, as config.rs requires).
    block_size: usize,
    /// Each (item, kv head slice)'s splits as one thread-block cluster, merged in distributed
    /// shared memory (sm_90; the case is skipped elsewhere); launched twice, as graph replay does.
    cluster: bool,
    /// The tensor-core kernel built with a ring of this many warp steps in shared memory
    /// (`DMMA_RING`; 0: its register passes; None: the build's default, 2 with e4m3). The lane
    /// kernel is not run when set.
    ring: Option<usize>,
}

impl Default for Decode {
    fn default() -> Self {
        Decode {
            seed: 10,
            head_dim: 128,
            heads: 8,
            kv_heads: 2,
            ctx: vec![1, 17, 300, 1000],
            splits: None,
            window: 0,
            inline: false,
            ctas_per_sm: 0,
            fp8: false,
            block_size: 16,
            cluster: false,
            ring: None,
        }
    }
}

impl Decode {
    /// The case on the lane kernel, then on the tensor-core kernel where the shape has one.
    fn run(&self) {
        if self.ring.is_none() {
            self.run_on(DecodeKernel::Lanes);
        }
        if decode_mma_supported(self.head_dim, self.fp8) {
            self.run_on(DecodeKernel::Mma);
        }
    }

    fn run_on(&self, kernel: DecodeKernel) {
        let group = self.heads / self.kv_heads;
        let ring = self.ring.map(|n| [("DMMA_RING", n)]);
        let defines = ring.as_ref().map_or(&[][..], |r| &r[..]);
        let Some(g) = attention_gpu_tuned(self.head_dim, group, self.fp8, defines) else {
            return;
        };
        if self.cluster && !decode_cluster_supported(&g) {
            eprintln!("skipped: no thread-block clusters before sm_90");
            return;
        }
        let mut r = rng(self.seed);
        let (hd, heads, bs) = (self.head_dim, self.heads, self.block_size);
        let layout = KvLayout {
            kv_heads: self.kv_heads,
            block_size: bs,
            head_dim: hd,
        };
        let ctx = &self.ctx;
        let mut paged = Paged::random_kv(&mut r, ctx, 7, layout, self.fp8);
        let mut freed = 0;
        if self.window > 0 {
            for (s, &c) in ctx.iter().enumerate() {
                freed += paged.free_before(s, c.saturating_sub(self.window));
            }
        }
        // Items in a shuffled order, on token rows with gaps, as in a mixed batch.
        let n = ctx.len();
        let mut item_seq: Vec<i32> = (0..n as i32).collect();
        item_seq.shuffle(&mut r);
        let item_row: Vec<i32> = (0..n as i32).map(|i| 2 * i + 1).collect();
        let rows = 2 * n + 1;
        let q = rand_bf16(&mut r, rows * heads * hd, 1.0);
        let max_ctx = *ctx.iter().max().unwrap();
        let num_splits = self.splits.unwrap_or_else(|| {
            let s = match self.ctas_per_sm {
                0 => decode_splits(g.num_sms, n, self.kv_heads, max_ctx),
                c => decode_splits_filled(
                    g.num_sms,
                    c,
                    n,
                    self.kv_heads,
                    group,
                    max_ctx,
                    decode_min_split_keys(kernel, max_ctx),
                ),
            };
            match self.cluster {
                true => s.min(DECODE_CLUSTER_MAX),
                false => s,
            }
        });
        let (qb, rows_b, seqs_b) = (dev(&g, &q), dev(&g, &item_row), dev(&g, &item_seq));
        let dp = paged.upload(&g);
        let out = poisoned::<bf16>(&g, rows * heads * hd);
        let part_acc = poisoned::<f32>(&g, n * heads * num_splits * hd);
        let part_ml = poisoned::<f32>(&g, n * heads * num_splits * 2);
        let num_counters = n * self.kv_heads * decode_group_ctas_for(group, self.fp8);
        let counters = dev(&g, &vec![0u32; num_counters]);
        let scale = 1.0 / (hd as f32).sqrt();
        let p = PagedDecodeParams {
            q: qb.ptr(),
            k_cache: dp.k_cache.ptr(),
            v_cache: dp.v_cache.ptr(),
            item_row: rows_b.ptr(),
            item_seq: seqs_b.ptr(),
            block_tables: dp.block_tables.ptr(),
            context_lens: dp.context_lens.ptr(),
            out: out.ptr(),
            part_acc: part_acc.ptr(),
            part_ml: part_ml.ptr(),
            counters: if self.inline { counters.ptr() } else { 0 },
            num_items: n as i32,
            num_heads: heads as i32,
            num_kv_heads: self.kv_heads as i32,
            block_size: bs as i32,
            max_blocks: paged.max_blocks as i32,
            num_splits: num_splits as i32,
            window: self.window as i32,
            scale,
        };
        let cluster = self.cluster;
        unsafe { kernels::paged_decode(&g, &p, hd, kernel, cluster).unwrap() };
        if self.inline || cluster {
            // A second launch on the same counters (graph replay): it must find them at zero.
            let first = read_bf16(&g, &out, rows * heads * hd);
            g.memset(out.ptr(), 0xff, rows * heads * hd * 2).unwrap();
            unsafe { kernels::paged_decode(&g, &p, hd, kernel, cluster).unwrap() };
            let again = read_bf16(&g, &out, rows * heads * hd);
            let same = first
                .iter()
                .zip(&again)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{kernel:?}: the second in-kernel merge differs from the first (cluster {cluster})"
            );
            let left: Vec<u32> = read(&g, &counters, num_counters);
            assert!(left.iter().all(|&c| c == 0), "counters left at {left:?}");
        }
        let got = read_bf16(&g, &out, rows * heads * hd);
        let qf = to_f32(&q);
        for i in 0..n {
            let (s, row) = (item_seq[i] as usize, item_row[i] as usize);
            for h in 0..heads {
                let o = (row * heads + h) * hd;
                let want = paged.attend_window_ref(
                    &qf[o..o + hd],
                    s,
                    h / group,
                    ctx[s],
                    self.window,
                    scale as f64,
                );
                assert_close(
                    &format!(
                        "decode {kernel:?} hd{hd} g{group} fp8 {} ring {:?} bs {bs} splits {num_splits} inline {} cluster {cluster} window {} ({freed} blocks freed) item {i} ctx {} head {h}",
                        self.fp8, self.ring, self.inline, self.window, ctx[s]
                    ),
                    &got[o..o + hd],
                    &want,
                    1e-2,
                );
            }
        }
        // Rows that are not decode items stay untouched.
        assert!(
            got[..heads * hd].iter().all(|x| x.is_nan()),
            "row 0 was written"
        );
    }
}

#[test]
fn paged_decode_mha_hd128_one_split() {
    Decode {
        heads: 4,
        kv_heads: 4,
        splits: Some(1),
        ..Decode::default()
    }
    .run();
}

#[test]
fn paged_decode_gqa_hd128_split_k() {
    Decode {
        seed: 11,
        ctx: vec![5, 333, 2049, 4097, 64],
        ..Decode::default()
    }
    .run();
    Decode {
        seed: 12,
        heads: 16,
        ctx: vec![700, 1],
        splits: Some(7),
        ..Decode::default()
    }
    .run();
}

/// Every head size of the families (Llama 64/128, Phi-3 96, 80, Gemma-style 256) against every
/// group from MHA to 16 query heads per kv head (Qwen2.5-7B: 7, -14B: 5; 9..16 take two CTAs per
/// kv head), with and without split-K.
#[test]
fn paged_decode_every_head_dim_and_group() {
    every_head_dim_and_group(&[64, 80, 96, 128, 256], 100, false);
}

/// Groups 1..16 on 2 kv heads at each of `head_dims`, contexts 3/37/301, split 1-3 (seeds from
/// `seed0`), with the cache in bf16 or e4m3.
fn every_head_dim_and_group(head_dims: &[usize], seed0: u64, fp8: bool) {
    for (i, &head_dim) in head_dims.iter().enumerate() {
        for group in 1..=16 {
            Decode {
                seed: seed0 + (i * 16 + group) as u64,
                head_dim,
                heads: 2 * group,
                kv_heads: 2,
                ctx: vec![3, 37, 301],
                splits: Some(1 + group % 3),
                fp8,
                ..Decode::default()
            }
            .run();
        }
    }
}

/// A sliding window shorter than the contexts: only the last `window` keys count, blocks wholly
/// before the window are freed and never read, with split-K cutting the window (not the
/// context), and contexts inside the window unchanged.
#[test]
fn paged_decode_sliding_window() {
    for (seed, head_dim, group, splits) in [
        (30, 128, 4, None),
        (31, 96, 1, Some(5)),
        (32, 64, 7, Some(1)),
    ] {
        Decode {
            seed,
            head_dim,
            heads: 2 * group,
            window: 100,
            ctx: vec![1, 99, 100, 101, 517, 2050],
            splits,
            ..Decode::default()
        }
        .run();
    }
}

/// Block sizes from 1 to 64 keys: the tensor-core kernel's steps of 16 keys share one
/// block-table entry from 16 on and look each key up below that; split and not, under a window.
#[test]
fn paged_decode_block_sizes() {
    for (i, block_size) in [1, 4, 8, 32, 64].into_iter().enumerate() {
        for (fp8, window) in [(false, 0), (true, 0), (false, 90)] {
            Decode {
                seed: 450 + i as u64,
                heads: 8,
                kv_heads: 2,
                ctx: vec![1, 17, 300, 1000],
                splits: Some(1 + i % 3),
                inline: i % 2 == 0,
                window,
                fp8,
                block_size,
                ..Decode::default()
            }
            .run();
        }
    }
}

/// `merge` (its seed the first; its merge switches) at every head size against groups 1, 4, 7,
/// 12 and 16 on 2 kv heads (9..16 take two CTAs per kv head), contexts 3 to 1030, head size i
/// and `group` with `splits(i, group)` splits.
fn merged_head_dims_and_groups(merge: &Decode, splits: impl Fn(usize, usize) -> usize) {
    for (i, head_dim) in [64, 80, 96, 128, 256].into_iter().enumerate() {
        for group in [1, 4, 7, 12, 16] {
            Decode {
                seed: merge.seed + (i * 16 + group) as u64,
                head_dim,
                heads: 2 * group,
                kv_heads: 2,
                ctx: vec![3, 37, 301, 1030],
                splits: Some(splits(i, group)),
                ..merge.clone()
            }
            .run();
        }
    }
}

/// The splits merged inside the decode kernel (the last CTA of each (item, kv head slice) to
/// arrive merges): every head size and a spread of groups (9..16 take two CTAs per kv head, so
/// two counters per kv head), split counts from 2 to 64, with a sliding window, and twice in a
/// row on the same counters (what graph replay does).
#[test]
fn paged_decode_inline_merge() {
    let inline = Decode {
        seed: 400,
        inline: true,
        ..Decode::default()
    };
    merged_head_dims_and_groups(&inline, |i, group| 2 + (i + group) % 6);
    for (seed, splits, window) in [(420, 64, 0), (421, 33, 0), (422, 16, 100), (423, 5, 700)] {
        Decode {
            seed,
            ctx: vec![1, 64, 99, 100, 517, 4097],
            splits: Some(splits),
            window,
            inline: true,
            ..Decode::default()
        }
        .run();
    }
}

/// The split rule that fills the SMs at batch 1 (up to 64 splits), merged either way, on
/// Llama-2-7B's and Llama-3-8B's head shapes at long contexts.
#[test]
fn paged_decode_filled_splits() {
    for (seed, heads, kv_heads, ctas) in [(430, 32, 32, 4), (431, 32, 8, 4), (432, 32, 8, 8)] {
        for inline in [false, true] {
            Decode {
                seed,
                heads,
                kv_heads,
                ctx: vec![4100],
                ctas_per_sm: ctas,
                inline,
                ..Decode::default()
            }
            .run();
        }
    }
}

/// An e4m3 cache: every head size (16 for the tiny test checkpoints) against groups 1..16
/// (5..8 take two CTAs per kv head at 4 heads a CTA, 13..16 four), split and not.
#[test]
fn paged_decode_fp8_every_head_dim_and_group() {
    every_head_dim_and_group(&[16, 64, 80, 96, 128, 256], 600, true);
}

/// An e4m3 cache at batch sizes 1 to 40 and contexts from 1 to 8k, on Llama-2-7B's (MHA) and
/// Llama-3-8B's (GQA 4) head shapes: the split rules the backend uses, merged both ways (the
/// in-kernel merge twice on the same counters), and under a sliding window.
#[test]
fn paged_decode_fp8_batches_contexts_merges_and_window() {
    let batch40: Vec<usize> = (0..40).map(|i| 1 + i * 97 % 2100).collect();
    for (seed, heads, kv_heads, ctx) in [
        (640, 32, 32, vec![8191]),
        (641, 32, 8, vec![4100]),
        (642, 32, 32, vec![1, 17, 300, 1000, 2049]),
        (643, 32, 8, batch40.clone()),
        (644, 8, 8, batch40),
    ] {
        for (ctas, inline) in [(0, false), (8, true), (4, false)] {
            Decode {
                seed,
                heads,
                kv_heads,
                ctx: ctx.clone(),
                ctas_per_sm: ctas,
                inline,
                fp8: true,
                ..Decode::default()
            }
            .run();
        }
    }
    for (seed, head_dim, group, splits) in [(650, 128, 4, None), (651, 96, 1, Some(5))] {
        Decode {
            seed,
            head_dim,
            heads: 2 * group,
            window: 100,
            ctx: vec![1, 99, 100, 101, 517, 2050],
            splits,
            inline: true,
            fp8: true,
            ..Decode::default()
        }
        .run();
    }
}

/// The splits of each (item, kv head slice) as one thread-block cluster, merged in distributed
/// shared memory: every head size and a spread of groups (9..16 take two CTAs, so two clusters,
/// per kv head), 2 to 16 splits (more splits than keys for the shortest contexts: empty splits
/// join the merge), under a sliding window, over an e4m3 cache, at the split rule's batch-1
/// count on Llama-2-7B's and Llama-3-8B's heads, and twice in a row (graph replay).
#[test]
fn paged_decode_cluster_merge() {
    let cluster = Decode {
        seed: 700,
        cluster: true,
        ..Decode::default()
    };
    merged_head_dims_and_groups(&cluster, |i, group| 2 + (i + group) % 15);
    for (seed, splits, window, fp8) in [
        (720, 16, 0, false),
        (721, 13, 0, true),
        (722, 16, 100, false),
        (723, 5, 700, true),
    ] {
        Decode {
            seed,
            ctx: vec![1, 64, 99, 100, 517, 4097],
            splits: Some(splits),
            window,
            fp8,
            cluster: true,
            ..Decode::default()
        }
        .run();
    }
    for (seed, heads, kv_heads, ctas) in [(730, 32, 32, 8), (731, 32, 8, 4)] {
        Decode {
            seed,
            heads,
            kv_heads,
            ctx: vec![4100],
            ctas_per_sm: ctas,
            cluster: true,
            ..Decode::default()
        }
        .run();
    }
}

/// The tensor-core kernel with its warp steps through a ring in shared memory (`DMMA_RING`):
/// rings of 2 to 4 steps and (e4m3, whose default is the ring) the register passes, both
/// caches, head dims 64/96/128 against groups 1/4/8 (bf16 also 80),
/// contexts from 1 to 4,097 (192: a CTA's split of one and a half register passes) at batch 1
/// to 40, split by the serving rules and merged both ways and in a cluster, a sliding window,
/// and blocks of 8 keys (the fallback that reads each key's block alone), 16 and 32.
#[test]
fn paged_decode_ring() {
    let batch40: Vec<usize> = (0..40).map(|i| 1 + i * 97 % 2100).collect();
    let mut seed = 900;
    for fp8 in [true, false] {
        for (head_dim, group) in [(128, 1), (128, 4), (64, 8), (96, 1), (80, 4)] {
            if !decode_mma_supported(head_dim, fp8) {
                continue;
            }
            for ring in [0, 2, 3, 4].into_iter().filter(|&n| n > 0 || fp8) {
                seed += 1;
                Decode {
                    seed,
                    head_dim,
                    heads: 2 * group,
                    kv_heads: 2,
                    ctx: vec![1, 17, 192, 300, 1000, 4097],
                    ctas_per_sm: 6,
                    inline: ring == 3,
                    fp8,
                    ring: Some(ring),
                    ..Decode::default()
                }
                .run();
            }
        }
        for (heads, kv_heads, ctx, ctas, inline, cluster) in [
            (32, 32, vec![192; 24], 0, false, false),
            (32, 8, batch40.clone(), 8, true, false),
            (32, 32, vec![4100], 6, false, true),
            (32, 8, vec![4100], 4, true, false),
        ] {
            seed += 1;
            Decode {
                seed,
                heads,
                kv_heads,
                ctx,
                ctas_per_sm: ctas,
                inline,
                cluster,
                fp8,
                ring: Some(3),
                ..Decode::default()
            }
            .run();
        }
        for (window, block_size, splits) in [(100, 16, None), (0, 8, None), (0, 32, Some(3))] {
            seed += 1;
            Decode {
                seed,
                window,
                block_size,
                splits,
                ctx: vec![1, 99, 100, 101, 192, 517, 2050],
                inline: true,
                fp8,
                ring: Some(3),
                ..Decode::default()
            }
            .run();
        }
    }
}
