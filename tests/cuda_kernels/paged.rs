//! The paged KV cache of the attention tests: a random cache and block tables, the attention and
//! K/V-write references over it, and the prefill fixture (a batch of sequences with cached
//! prefixes) that both prefill paths run on.

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::kernels::{self, scores_ld, PrefillAttnParams, PREFILL_TILE};
use brook::executor::cuda::prefill_gemm::{gemm_attention, GemmAttention, GemmPlanner, GemmSeq};
use half::bf16;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::harness::{
    assert_close, dev, e4m3, poisoned, rand_bf16, rand_f32, through_e4m3, to_f32,
};

/// Where (slot, kv head) rows sit in a cache [num_blocks, kv_heads, block_size, head_dim].
#[derive(Clone, Copy)]
pub struct KvLayout {
    pub kv_heads: usize,
    pub block_size: usize,
    pub head_dim: usize,
}

impl KvLayout {
    pub fn offset(&self, slot: usize, kh: usize) -> usize {
        ((slot / self.block_size * self.kv_heads + kh) * self.block_size + slot % self.block_size)
            * self.head_dim
    }
}

/// A paged cache with random contents. An e4m3 cache (`fp8`) holds random values quantized
/// by the CPU reference quantizer (`harness::e4m3`); `k` and `v` hold them as bf16 (exact: every
/// e4m3 value is a bf16), so the references read them as they read a bf16 cache, and `upload`
/// sends their e4m3 bits.
pub struct Cache {
    pub k: Vec<bf16>,
    pub v: Vec<bf16>,
    pub layout: KvLayout,
    pub fp8: bool,
}

impl Cache {
    fn random(r: &mut ChaCha8Rng, num_blocks: usize, layout: KvLayout, fp8: bool) -> Cache {
        let n = num_blocks * layout.kv_heads * layout.block_size * layout.head_dim;
        let values = |r: &mut ChaCha8Rng| -> Vec<bf16> {
            match fp8 {
                false => rand_bf16(r, n, 1.0),
                true => rand_f32(r, n, 1.0)
                    .into_iter()
                    .map(|x| bf16::from_f32(through_e4m3(x)))
                    .collect(),
            }
        };
        Cache {
            k: values(r),
            v: values(r),
            layout,
            fp8,
        }
    }

    /// K or V as the device holds it.
    fn upload_one(&self, g: &Gpu, x: &[bf16]) -> DevBuf {
        match self.fp8 {
            false => dev(g, x),
            true => {
                let bits: Vec<u8> = x.iter().map(|v| e4m3(v.to_f32())).collect();
                dev(g, &bits)
            }
        }
    }

    pub fn k_row(&self, slot: usize, kh: usize) -> &[bf16] {
        let o = self.layout.offset(slot, kh);
        &self.k[o..o + self.layout.head_dim]
    }

    pub fn v_row(&self, slot: usize, kh: usize) -> &[bf16] {
        let o = self.layout.offset(slot, kh);
        &self.v[o..o + self.layout.head_dim]
    }
}

/// Random distinct blocks for sequences of the given context lengths: block tables padded to the
/// longest with block 0.
fn block_tables(
    r: &mut ChaCha8Rng,
    ctx: &[usize],
    block_size: usize,
    num_blocks: usize,
) -> (Vec<i32>, usize) {
    let max_blocks = ctx.iter().map(|c| c.div_ceil(block_size)).max().unwrap();
    let mut pool: Vec<i32> = (0..num_blocks as i32).collect();
    pool.shuffle(r);
    let mut next = 0;
    let mut bt = vec![0i32; ctx.len() * max_blocks];
    for (s, c) in ctx.iter().enumerate() {
        for b in 0..c.div_ceil(block_size) {
            bt[s * max_blocks + b] = pool[next];
            next += 1;
        }
    }
    assert!(next <= num_blocks);
    (bt, max_blocks)
}

/// Sequences of the given context lengths in a random cache of `spare` blocks more than they
/// need, each holding distinct random blocks.
pub struct Paged {
    pub cache: Cache,
    pub ctx: Vec<usize>,
    /// [sequences, max_blocks], padded with block 0.
    pub bt: Vec<i32>,
    pub max_blocks: usize,
}

impl Paged {
    /// `ctx` sequences over a random cache (e4m3 when `fp8`, see `Cache`).
    pub fn random_kv(
        r: &mut ChaCha8Rng,
        ctx: &[usize],
        spare: usize,
        layout: KvLayout,
        fp8: bool,
    ) -> Paged {
        let bs = layout.block_size;
        let num_blocks = ctx.iter().map(|c| c.div_ceil(bs)).sum::<usize>() + spare;
        let cache = Cache::random(r, num_blocks, layout, fp8);
        let (bt, max_blocks) = block_tables(r, ctx, bs, num_blocks);
        Paged {
            cache,
            ctx: ctx.to_vec(),
            bt,
            max_blocks,
        }
    }

    /// The cache slot of key `j` of sequence `s`.
    pub fn slot(&self, s: usize, j: usize) -> usize {
        let bs = self.cache.layout.block_size;
        self.bt[s * self.max_blocks + j / bs] as usize * bs + j % bs
    }

    /// Softmax attention of one query row over keys 0..n of sequence `s` on kv head `kh`, in
    /// f64; over the last `window` of them only when `window` > 0.
    pub fn attend_window_ref(
        &self,
        q: &[f32],
        s: usize,
        kh: usize,
        n: usize,
        window: usize,
        scale: f64,
    ) -> Vec<f32> {
        let first = if window == 0 {
            0
        } else {
            n.saturating_sub(window)
        };
        let keys: Vec<usize> = (first..n).collect();
        let scores: Vec<f64> = keys
            .iter()
            .map(|&j| {
                q.iter()
                    .zip(self.cache.k_row(self.slot(s, j), kh))
                    .map(|(a, b)| *a as f64 * b.to_f32() as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = w.iter().sum();
        let mut out = vec![0f64; self.cache.layout.head_dim];
        for (&j, wj) in keys.iter().zip(&w) {
            for (o, v) in out.iter_mut().zip(self.cache.v_row(self.slot(s, j), kh)) {
                *o += wj / z * v.to_f32() as f64;
            }
        }
        out.into_iter().map(|x| x as f32).collect()
    }

    /// Marks freed (-1, as `kv::NULL_BLOCK` reaches the kernels) every block of sequence `s`
    /// that lies wholly before key `first_visible`, as the KV manager frees blocks behind a
    /// sliding window: a kernel that read one would fault or read garbage. Returns how many.
    pub fn free_before(&mut self, s: usize, first_visible: usize) -> usize {
        let n = first_visible / self.cache.layout.block_size;
        self.bt[s * self.max_blocks..][..n].fill(-1);
        n
    }

    /// The cache, block tables and context lengths on the device.
    pub fn upload(&self, g: &Gpu) -> DevPaged {
        let ctx: Vec<i32> = self.ctx.iter().map(|&c| c as i32).collect();
        DevPaged {
            k_cache: self.cache.upload_one(g, &self.cache.k),
            v_cache: self.cache.upload_one(g, &self.cache.v),
            block_tables: dev(g, &self.bt),
            context_lens: dev(g, &ctx),
        }
    }
}

/// A `Paged` on the device, named as the kernels' parameters name them.
pub struct DevPaged {
    pub k_cache: DevBuf,
    pub v_cache: DevBuf,
    pub block_tables: DevBuf,
    pub context_lens: DevBuf,
}

/// A prefill batch over a random paged cache: per sequence (query tokens, context), block size 16.
pub struct PrefillBatch {
    pub heads: usize,
    pub seqs: Vec<(usize, usize)>,
    /// Sliding window in keys; 0: none (the GEMM path takes only 0).
    pub window: usize,
    pub paged: Paged,
    pub q: Vec<bf16>,
    /// First token row of each sequence.
    pub q_start: Vec<usize>,
}

impl PrefillBatch {
    pub fn random(
        r: &mut ChaCha8Rng,
        head_dim: usize,
        heads: usize,
        kv_heads: usize,
        seqs: &[(usize, usize)],
    ) -> PrefillBatch {
        PrefillBatch::random_kv(r, (head_dim, heads, kv_heads), seqs, false)
    }

    /// `random` over an e4m3 cache when `fp8` (`Cache`).
    pub fn random_kv(
        r: &mut ChaCha8Rng,
        (head_dim, heads, kv_heads): (usize, usize, usize),
        seqs: &[(usize, usize)],
        fp8: bool,
    ) -> PrefillBatch {
        let layout = KvLayout {
            kv_heads,
            block_size: 16,
            head_dim,
        };
        let ctx: Vec<usize> = seqs.iter().map(|s| s.1).collect();
        let paged = Paged::random_kv(r, &ctx, 5, layout, fp8);
        let mut q_start = Vec::new();
        let mut t = 0;
        for &(qlen, c) in seqs {
            assert!(qlen <= c);
            q_start.push(t);
            t += qlen;
        }
        PrefillBatch {
            heads,
            seqs: seqs.to_vec(),
            window: 0,
            q: rand_bf16(r, t * heads * head_dim, 1.0),
            paged,
            q_start,
        }
    }

    /// Attention limited to the last `window` keys of each query, with the blocks wholly before
    /// each sequence's first query's window freed. Returns how many blocks were freed.
    pub fn with_window(&mut self, window: usize) -> usize {
        self.window = window;
        let mut freed = 0;
        for (s, &(qlen, c)) in self.seqs.iter().enumerate() {
            freed += self
                .paged
                .free_before(s, (c - qlen + 1).saturating_sub(window));
        }
        freed
    }

    pub fn layout(&self) -> KvLayout {
        self.paged.cache.layout
    }

    pub fn tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.0).sum()
    }

    pub fn scale(&self) -> f32 {
        1.0 / (self.layout().head_dim as f32).sqrt()
    }

    pub fn row_elems(&self) -> usize {
        self.heads * self.layout().head_dim
    }

    pub fn group(&self) -> usize {
        self.heads / self.layout().kv_heads
    }

    /// The reference attention output of every token row, [tokens, heads, head_dim].
    pub fn reference(&self) -> Vec<f32> {
        let qf = to_f32(&self.q);
        let hd = self.layout().head_dim;
        let mut out = vec![0f32; self.tokens() * self.row_elems()];
        for (s, &(qlen, c)) in self.seqs.iter().enumerate() {
            for i in 0..qlen {
                for h in 0..self.heads {
                    let o = ((self.q_start[s] + i) * self.heads + h) * hd;
                    let want = self.paged.attend_window_ref(
                        &qf[o..o + hd],
                        s,
                        h / self.group(),
                        c - qlen + i + 1,
                        self.window,
                        self.scale() as f64,
                    );
                    out[o..o + hd].copy_from_slice(&want);
                }
            }
        }
        out
    }

    /// Each (sequence, query, head) row of `got` against `want` ([tokens, heads, head_dim]),
    /// named by `seq_label(s)` and the query and head.
    pub fn assert_rows(
        &self,
        got: &[f32],
        want: &[f32],
        tol: f64,
        seq_label: impl Fn(usize) -> String,
    ) {
        let hd = self.layout().head_dim;
        for (s, &(qlen, _)) in self.seqs.iter().enumerate() {
            let label = seq_label(s);
            for i in 0..qlen {
                for h in 0..self.heads {
                    let o = ((self.q_start[s] + i) * self.heads + h) * hd;
                    assert_close(
                        &format!("{label} query {i} head {h}"),
                        &got[o..o + hd],
                        &want[o..o + hd],
                        tol,
                    );
                }
            }
        }
    }

    /// Token rows of `seqs` in `v` ([tokens, heads, head_dim]).
    pub fn rows_of(&self, v: &[f32], seqs: &[usize]) -> Vec<f32> {
        let e = self.row_elems();
        seqs.iter()
            .flat_map(|&s| v[self.q_start[s] * e..(self.q_start[s] + self.seqs[s].0) * e].to_vec())
            .collect()
    }
}

/// The batch's buffers on the GPU, and runs of each path on chosen sequences into `out`.
pub struct PrefillRun<'a> {
    g: &'a Gpu,
    b: &'a PrefillBatch,
    q: DevBuf,
    paged: DevPaged,
    q_start: DevBuf,
    q_len: DevBuf,
}

impl<'a> PrefillRun<'a> {
    pub fn new(g: &'a Gpu, b: &'a PrefillBatch) -> Self {
        let q_start: Vec<i32> = b.q_start.iter().map(|&x| x as i32).collect();
        let q_len: Vec<i32> = b.seqs.iter().map(|s| s.0 as i32).collect();
        PrefillRun {
            g,
            b,
            q: dev(g, &b.q),
            paged: b.paged.upload(g),
            q_start: dev(g, &q_start),
            q_len: dev(g, &q_len),
        }
    }

    /// Tensor maps of the cache for the wgmma kernel's TMA build, where the test's Gpu takes it
    /// (`prefill_tma`, `prefill_wgmma`, the build loaded: a bf16 cache on Hopper).
    fn tma_maps(&self) -> Option<DevBuf> {
        let layout = self.b.layout();
        let loaded = self
            .g
            .has_function(&kernels::prefill_tma_kernel(self.g, layout.head_dim));
        let cache = &self.b.paged.cache;
        (self.g.prefill_tma && self.g.prefill_wgmma && loaded && !cache.fp8).then(|| {
            let blocks = cache.k.len() / (layout.kv_heads * layout.block_size * layout.head_dim);
            let caches = [(self.paged.k_cache.ptr(), self.paged.v_cache.ptr())];
            let (kvh, bs, hd) = (layout.kv_heads, layout.block_size, layout.head_dim);
            kernels::kv_tensor_maps(self.g, &caches, blocks, kvh, bs, hd).unwrap()
        })
    }

    /// The flash kernel on `seqs` (64-query tiles), unsplit.
    pub fn flash(&self, seqs: &[usize], out: &DevBuf) {
        self.flash_split(seqs, out, 1, 1);
    }

    /// The flash kernel on `seqs` with `splits` CTAs per (tile, head) over the keys (partials
    /// poisoned, counters zeroed once), launched `runs` times into `out` (the arrival counters
    /// must be back at zero for each next launch).
    pub fn flash_split(&self, seqs: &[usize], out: &DevBuf, splits: usize, runs: usize) {
        let (mut tile_seq, mut tile_q0) = (Vec::new(), Vec::new());
        for &s in seqs {
            for q0 in (0..self.b.seqs[s].0).step_by(PREFILL_TILE) {
                tile_seq.push(s as i32);
                tile_q0.push(q0 as i32);
            }
        }
        let (ts, tq) = (dev(self.g, &tile_seq), dev(self.g, &tile_q0));
        let layout = self.b.layout();
        let groups = tile_seq.len() * self.b.heads;
        let part_acc = poisoned::<f32>(self.g, groups * splits * PREFILL_TILE * layout.head_dim);
        let part_ml = poisoned::<f32>(self.g, groups * splits * PREFILL_TILE * 2);
        let counters = dev(self.g, &vec![0u32; groups]);
        let maps = self.tma_maps();
        let p = PrefillAttnParams {
            q: self.q.ptr(),
            k_cache: self.paged.k_cache.ptr(),
            v_cache: self.paged.v_cache.ptr(),
            tile_seq: ts.ptr(),
            tile_q0: tq.ptr(),
            q_start: self.q_start.ptr(),
            q_len: self.q_len.ptr(),
            context_lens: self.paged.context_lens.ptr(),
            block_tables: self.paged.block_tables.ptr(),
            out: out.ptr(),
            part_acc: part_acc.ptr(),
            part_ml: part_ml.ptr(),
            counters: counters.ptr(),
            num_tiles: tile_seq.len() as i32,
            num_heads: self.b.heads as i32,
            num_kv_heads: layout.kv_heads as i32,
            block_size: layout.block_size as i32,
            max_blocks: self.b.paged.max_blocks as i32,
            window: self.b.window as i32,
            num_splits: splits as i32,
            scale: self.b.scale(),
            kv_maps: maps.as_ref().map_or(0, DevBuf::ptr),
        };
        let bytes = self.b.tokens() * self.b.row_elems() * 2;
        for run in 0..runs {
            if run > 0 {
                self.g.memset(out.ptr(), 0xff, bytes).unwrap();
            }
            unsafe { kernels::prefill_attn(self.g, &p, layout.head_dim).unwrap() };
        }
        self.g.sync().unwrap();
    }

    /// The whole GEMM path on `seqs`, with scratch placed by the backend's planner and poisoned.
    pub fn gemm(&self, seqs: &[usize], out: &DevBuf) {
        let (b, layout) = (self.b, self.b.layout());
        assert_eq!(b.window, 0, "the GEMM path serves no sliding window");
        let mut planner = GemmPlanner::new(usize::MAX, b.heads, usize::MAX, usize::MAX);
        let placed: Vec<GemmSeq> = seqs
            .iter()
            .map(|&s| {
                let (qlen, c) = b.seqs[s];
                planner.place(s, b.q_start[s], qlen, c).unwrap()
            })
            .collect();
        let last = placed.last().unwrap();
        let keys = last.key0 + last.ctx;
        let score_floats = last.s0 + b.heads * last.q_len * scores_ld(last.ctx);
        let (hd, h) = (layout.head_dim, b.heads);
        let k_buf = poisoned::<bf16>(self.g, keys * h * hd);
        let v_buf = poisoned::<bf16>(self.g, keys * h * hd);
        let scores = poisoned::<f32>(self.g, score_floats);
        let col = |f: fn(&GemmSeq) -> usize| -> DevBuf {
            let v: Vec<i32> = placed.iter().map(|p| f(p) as i32).collect();
            dev(self.g, &v)
        };
        let (gs, gk, gs0) = (col(|p| p.seq), col(|p| p.key0), col(|p| p.s0));
        let p = GemmAttention {
            q: self.q.ptr(),
            out: out.ptr(),
            k_cache: self.paged.k_cache.ptr(),
            v_cache: self.paged.v_cache.ptr(),
            q_lens: self.q_len.ptr(),
            context_lens: self.paged.context_lens.ptr(),
            block_tables: self.paged.block_tables.ptr(),
            gemm_seq: gs.ptr(),
            gemm_key0: gk.ptr(),
            gemm_s0: gs0.ptr(),
            k_buf: k_buf.ptr(),
            v_buf: v_buf.ptr(),
            scores: scores.ptr(),
            seqs: &placed,
            num_heads: h,
            num_kv_heads: layout.kv_heads,
            head_dim: hd,
            block_size: layout.block_size,
            max_blocks: b.paged.max_blocks,
            scale: b.scale(),
        };
        unsafe { gemm_attention(self.g, &p).unwrap() };
        self.g.sync().unwrap();
    }
}
