//! Every CUDA kernel against a CPU reference on random inputs (odd sizes, random block tables,
//! outputs poisoned before the run). Without a GPU each test says so and returns, so CPU CI stays
//! green; with `BROOK_REQUIRE_GPU=1` (scripts/gpu-check.sh) a missing GPU fails instead.

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::gemm;
use brook::executor::cuda::kernels::{self, *};
use brook::executor::cuda::prefill_gemm::{gemm_attention, GemmAttention, GemmPlanner, GemmSeq};
use brook::model::config::{RopeConfig, RopeScaling};
use brook::sampling::params::SamplingParams;
use brook::sampling::sampler::{argmax, Sampler};
use half::bf16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn gpu() -> Option<Gpu> {
    let required = std::env::var("BROOK_REQUIRE_GPU").is_ok_and(|v| v == "1");
    match brook::executor::cuda::probe() {
        Ok(()) => Some(Gpu::open(0).expect("a GPU is present, so opening it must work")),
        Err(e) if required => panic!("BROOK_REQUIRE_GPU=1 but no GPU: {e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn rand_f32(r: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-scale..scale)).collect()
}

fn rand_bf16(r: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<bf16> {
    rand_f32(r, n, scale)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

fn to_f32(xs: &[bf16]) -> Vec<f32> {
    xs.iter().map(|x| x.to_f32()).collect()
}

/// A device buffer holding `data`.
fn dev<T: Copy>(g: &Gpu, data: &[T]) -> DevBuf {
    let b = g.alloc(std::mem::size_of_val(data)).unwrap();
    g.upload(b.ptr(), data).unwrap();
    b
}

/// A device buffer of `n` elements of `T`, every byte 0xff (NaN for floats and bf16).
fn poisoned<T>(g: &Gpu, n: usize) -> DevBuf {
    let bytes = n * std::mem::size_of::<T>();
    let b = g.alloc(bytes).unwrap();
    g.memset(b.ptr(), 0xff, bytes).unwrap();
    b
}

fn read<T: Copy + Default>(g: &Gpu, b: &DevBuf, n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    g.download(&mut v, b.ptr()).unwrap();
    v
}

fn read_bf16(g: &Gpu, b: &DevBuf, n: usize) -> Vec<f32> {
    let raw: Vec<u16> = read(g, b, n);
    raw.into_iter()
        .map(|x| bf16::from_bits(x).to_f32())
        .collect()
}

/// ‖a − b‖ / ‖b‖, NaN-propagating (a NaN never passes).
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| ((*x - *y) as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let e = rel_err(got, want);
    assert!(
        e < tol && got.iter().all(|x| x.is_finite()),
        "{what}: relative error {e:.3e} (tolerance {tol:.0e})"
    );
}

#[test]
fn embedding_gathers_rows() {
    let Some(g) = gpu() else { return };
    let mut r = rng(1);
    let (vocab, d, t) = (1003, 392, 37);
    let table = rand_bf16(&mut r, vocab * d, 1.0);
    let tokens: Vec<u32> = (0..t).map(|_| r.random_range(0..vocab as u32)).collect();
    let (tb, tk, out) = (
        dev(&g, &table),
        dev(&g, &tokens),
        poisoned::<f32>(&g, t * d),
    );
    let p = EmbeddingParams {
        table: tb.ptr(),
        tokens: tk.ptr(),
        out: out.ptr(),
        num_tokens: t as i32,
        d: d as i32,
    };
    unsafe { kernels::embedding(&g, &p).unwrap() };
    let got: Vec<f32> = read(&g, &out, t * d);
    for (i, &tok) in tokens.iter().enumerate() {
        let want = to_f32(&table[tok as usize * d..(tok as usize + 1) * d]);
        assert_eq!(&got[i * d..(i + 1) * d], &want[..], "row {i}");
    }
}

fn rmsnorm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, w)| (*v as f64 * inv * *w as f64) as f32)
        .collect()
}

#[test]
fn add_rmsnorm_updates_residual_and_normalises() {
    let Some(g) = gpu() else { return };
    let mut r = rng(2);
    // Every chunk count up to the largest hidden size; 1000 leaves threads without a chunk.
    for (t, d) in [(23usize, 1000usize), (3, 8192), (2, 384)] {
        let eps = 1e-5f32;
        let residual = rand_f32(&mut r, t * d, 2.0);
        let delta = rand_bf16(&mut r, t * d, 1.0);
        let weight = rand_bf16(&mut r, d, 1.5);
        let (res, de, w) = (dev(&g, &residual), dev(&g, &delta), dev(&g, &weight));
        // All rows, with the residual add.
        let out = poisoned::<bf16>(&g, t * d);
        let p = AddRmsNormParams {
            residual: res.ptr(),
            delta: de.ptr(),
            weight: w.ptr(),
            rows: 0,
            out: out.ptr(),
            num_rows: t as i32,
            d: d as i32,
            eps,
        };
        unsafe { kernels::add_rmsnorm(&g, &p).unwrap() };
        let new_res: Vec<f32> = read(&g, &res, t * d);
        let want_res: Vec<f32> = residual
            .iter()
            .zip(&delta)
            .map(|(a, b)| a + b.to_f32())
            .collect();
        assert_eq!(new_res, want_res);
        let wf = to_f32(&weight);
        let want: Vec<f32> = (0..t)
            .flat_map(|i| rmsnorm_ref(&want_res[i * d..(i + 1) * d], &wf, eps))
            .collect();
        assert_close("add_rmsnorm", &read_bf16(&g, &out, t * d), &want, 8e-3);
        // A subset of rows (the final norm at sampled positions), no add.
        let rows: Vec<i32> = vec![t as i32 - 1, 0, t as i32 / 2];
        let (rb, out2) = (dev(&g, &rows), poisoned::<bf16>(&g, rows.len() * d));
        let p2 = AddRmsNormParams {
            delta: 0,
            rows: rb.ptr(),
            out: out2.ptr(),
            num_rows: rows.len() as i32,
            ..p
        };
        unsafe { kernels::add_rmsnorm(&g, &p2).unwrap() };
        let want2: Vec<f32> = rows
            .iter()
            .flat_map(|&i| rmsnorm_ref(&want_res[i as usize * d..(i as usize + 1) * d], &wf, eps))
            .collect();
        assert_close(
            "rmsnorm rows",
            &read_bf16(&g, &out2, rows.len() * d),
            &want2,
            8e-3,
        );
        assert_eq!(
            read::<f32>(&g, &res, t * d),
            want_res,
            "no delta: residual unchanged"
        );
    }
}

#[test]
fn silu_mul_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut r = rng(3);
    let (t, inter) = (13, 1000);
    let gu = rand_f32(&mut r, t * 2 * inter, 4.0);
    let (gb, out) = (dev(&g, &gu), poisoned::<bf16>(&g, t * inter));
    let p = SiluMulParams {
        gate_up: gb.ptr(),
        out: out.ptr(),
        num_tokens: t as i32,
        inter: inter as i32,
    };
    unsafe { kernels::silu_mul(&g, &p).unwrap() };
    let f = gu;
    let want: Vec<f32> = (0..t)
        .flat_map(|i| {
            let row = &f[i * 2 * inter..(i + 1) * 2 * inter];
            (0..inter).map(move |j| row[j] / (1.0 + (-row[j]).exp()) * row[inter + j])
        })
        .collect();
    assert_close("silu_mul", &read_bf16(&g, &out, t * inter), &want, 5e-3);
}

/// A paged cache [num_blocks, kv_heads, block_size, head_dim] with random contents.
struct Cache {
    k: Vec<bf16>,
    v: Vec<bf16>,
    kv_heads: usize,
    block_size: usize,
    head_dim: usize,
}

impl Cache {
    fn random(
        r: &mut ChaCha8Rng,
        num_blocks: usize,
        kv_heads: usize,
        block_size: usize,
        head_dim: usize,
    ) -> Cache {
        let n = num_blocks * kv_heads * block_size * head_dim;
        Cache {
            k: rand_bf16(r, n, 1.0),
            v: rand_bf16(r, n, 1.0),
            kv_heads,
            block_size,
            head_dim,
        }
    }

    fn offset(&self, slot: usize, kh: usize) -> usize {
        ((slot / self.block_size * self.kv_heads + kh) * self.block_size + slot % self.block_size)
            * self.head_dim
    }

    fn k_row(&self, slot: usize, kh: usize) -> &[bf16] {
        let o = self.offset(slot, kh);
        &self.k[o..o + self.head_dim]
    }

    fn v_row(&self, slot: usize, kh: usize) -> &[bf16] {
        let o = self.offset(slot, kh);
        &self.v[o..o + self.head_dim]
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

/// Softmax attention of one query row over keys 0..n of a sequence, in f64.
fn attend_ref(q: &[f32], cache: &Cache, bt: &[i32], kh: usize, n: usize, scale: f64) -> Vec<f32> {
    let slot =
        |j: usize| bt[j / cache.block_size] as usize * cache.block_size + j % cache.block_size;
    let scores: Vec<f64> = (0..n)
        .map(|j| {
            q.iter()
                .zip(cache.k_row(slot(j), kh))
                .map(|(a, b)| *a as f64 * b.to_f32() as f64)
                .sum::<f64>()
                * scale
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut out = vec![0f64; cache.head_dim];
    for (j, wj) in w.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(cache.v_row(slot(j), kh)) {
            *o += wj / z * v.to_f32() as f64;
        }
    }
    out.into_iter().map(|x| x as f32).collect()
}

fn check_paged_decode(
    seed: u64,
    head_dim: usize,
    heads: usize,
    kv_heads: usize,
    ctx: &[usize],
    splits: Option<usize>,
) {
    let Some(g) = gpu() else { return };
    let mut r = rng(seed);
    let bs = 16;
    let num_blocks = ctx.iter().map(|c| c.div_ceil(bs)).sum::<usize>() + 7;
    let cache = Cache::random(&mut r, num_blocks, kv_heads, bs, head_dim);
    let (bt, max_blocks) = block_tables(&mut r, ctx, bs, num_blocks);
    // Items in a shuffled order, on token rows with gaps, as in a mixed batch.
    let n = ctx.len();
    let mut item_seq: Vec<i32> = (0..n as i32).collect();
    item_seq.shuffle(&mut r);
    let item_row: Vec<i32> = (0..n as i32).map(|i| 2 * i + 1).collect();
    let rows = 2 * n + 1;
    let q = rand_bf16(&mut r, rows * heads * head_dim, 1.0);
    let ctx_i: Vec<i32> = ctx.iter().map(|&c| c as i32).collect();
    let num_splits =
        splits.unwrap_or_else(|| decode_splits(g.num_sms, n, kv_heads, *ctx.iter().max().unwrap()));
    let bufs = [
        dev(&g, &q),
        dev(&g, &cache.k),
        dev(&g, &cache.v),
        dev(&g, &item_row),
        dev(&g, &item_seq),
        dev(&g, &bt),
        dev(&g, &ctx_i),
    ];
    let out = poisoned::<bf16>(&g, rows * heads * head_dim);
    let part_acc = poisoned::<f32>(&g, n * heads * num_splits * head_dim);
    let part_ml = poisoned::<f32>(&g, n * heads * num_splits * 2);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let p = PagedDecodeParams {
        q: bufs[0].ptr(),
        k_cache: bufs[1].ptr(),
        v_cache: bufs[2].ptr(),
        item_row: bufs[3].ptr(),
        item_seq: bufs[4].ptr(),
        block_tables: bufs[5].ptr(),
        context_lens: bufs[6].ptr(),
        out: out.ptr(),
        part_acc: part_acc.ptr(),
        part_ml: part_ml.ptr(),
        num_items: n as i32,
        num_heads: heads as i32,
        num_kv_heads: kv_heads as i32,
        block_size: bs as i32,
        max_blocks: max_blocks as i32,
        num_splits: num_splits as i32,
        scale,
    };
    unsafe { kernels::paged_decode(&g, &p, head_dim).unwrap() };
    let got = read_bf16(&g, &out, rows * heads * head_dim);
    let qf = to_f32(&q);
    let group = heads / kv_heads;
    for i in 0..n {
        let (s, row) = (item_seq[i] as usize, item_row[i] as usize);
        for h in 0..heads {
            let o = (row * heads + h) * head_dim;
            let want = attend_ref(
                &qf[o..o + head_dim],
                &cache,
                &bt[s * max_blocks..],
                h / group,
                ctx[s],
                scale as f64,
            );
            assert_close(
                &format!(
                    "decode hd{head_dim} g{group} splits {num_splits} item {i} ctx {} head {h}",
                    ctx[s]
                ),
                &got[o..o + head_dim],
                &want,
                1e-2,
            );
        }
    }
    // Rows that are not decode items stay untouched.
    assert!(
        got[..heads * head_dim].iter().all(|x| x.is_nan()),
        "row 0 was written"
    );
}

#[test]
fn paged_decode_mha_hd128_one_split() {
    check_paged_decode(10, 128, 4, 4, &[1, 17, 300, 1000], Some(1));
}

#[test]
fn paged_decode_gqa_hd128_split_k() {
    check_paged_decode(11, 128, 8, 2, &[5, 333, 2049, 4097, 64], None);
    check_paged_decode(12, 128, 16, 2, &[700, 1], Some(7));
}

#[test]
fn paged_decode_groups_of_three_and_six() {
    check_paged_decode(13, 64, 6, 2, &[2, 77, 900], None);
    check_paged_decode(14, 128, 12, 2, &[300, 31], Some(3));
}

#[test]
fn paged_decode_hd64_all_groups() {
    for (i, kv) in [8, 4, 2, 1].into_iter().enumerate() {
        check_paged_decode(20 + i as u64, 64, 8, kv, &[3, 129, 1500], Some(1 + i * 3));
    }
}

fn check_prefill(
    seed: u64,
    head_dim: usize,
    heads: usize,
    kv_heads: usize,
    seqs: &[(usize, usize)],
) {
    let Some(g) = gpu() else { return };
    let mut r = rng(seed);
    let bs = 16;
    let ctx: Vec<usize> = seqs.iter().map(|s| s.1).collect();
    let num_blocks = ctx.iter().map(|c| c.div_ceil(bs)).sum::<usize>() + 5;
    let cache = Cache::random(&mut r, num_blocks, kv_heads, bs, head_dim);
    let (bt, max_blocks) = block_tables(&mut r, &ctx, bs, num_blocks);
    let mut q_start = Vec::new();
    let (mut tile_seq, mut tile_q0) = (Vec::new(), Vec::new());
    let mut t = 0;
    for (s, &(qlen, _)) in seqs.iter().enumerate() {
        q_start.push(t as i32);
        for q0 in (0..qlen).step_by(PREFILL_TILE) {
            tile_seq.push(s as i32);
            tile_q0.push(q0 as i32);
        }
        t += qlen;
    }
    let q_len: Vec<i32> = seqs.iter().map(|s| s.0 as i32).collect();
    let ctx_i: Vec<i32> = ctx.iter().map(|&c| c as i32).collect();
    let q = rand_bf16(&mut r, t * heads * head_dim, 1.0);
    let b = [
        dev(&g, &q),
        dev(&g, &cache.k),
        dev(&g, &cache.v),
        dev(&g, &tile_seq),
        dev(&g, &tile_q0),
        dev(&g, &q_start),
        dev(&g, &q_len),
        dev(&g, &ctx_i),
        dev(&g, &bt),
    ];
    let out = poisoned::<bf16>(&g, t * heads * head_dim);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let p = PrefillAttnParams {
        q: b[0].ptr(),
        k_cache: b[1].ptr(),
        v_cache: b[2].ptr(),
        tile_seq: b[3].ptr(),
        tile_q0: b[4].ptr(),
        q_start: b[5].ptr(),
        q_len: b[6].ptr(),
        context_lens: b[7].ptr(),
        block_tables: b[8].ptr(),
        out: out.ptr(),
        num_tiles: tile_seq.len() as i32,
        num_heads: heads as i32,
        num_kv_heads: kv_heads as i32,
        block_size: bs as i32,
        max_blocks: max_blocks as i32,
        scale,
    };
    unsafe { kernels::prefill_attn(&g, &p, head_dim).unwrap() };
    let got = read_bf16(&g, &out, t * heads * head_dim);
    let qf = to_f32(&q);
    let group = heads / kv_heads;
    for (s, &(qlen, c)) in seqs.iter().enumerate() {
        for i in 0..qlen {
            let row = q_start[s] as usize + i;
            let pos = c - qlen + i;
            for h in 0..heads {
                let o = (row * heads + h) * head_dim;
                let want = attend_ref(
                    &qf[o..o + head_dim],
                    &cache,
                    &bt[s * max_blocks..],
                    h / group,
                    pos + 1,
                    scale as f64,
                );
                assert_close(&format!("prefill hd{head_dim} g{group} seq {s} (q {qlen}, ctx {c}) query {i} head {h}"), &got[o..o + head_dim], &want, 1.5e-2);
            }
        }
    }
}

#[test]
fn prefill_attention_causal_with_cached_prefix_hd128() {
    // (query tokens, context): fresh prompts, a cached prefix, a chunk that ends a long prefix.
    check_prefill(
        30,
        128,
        4,
        4,
        &[(70, 70), (5, 200), (130, 300), (64, 64), (2, 2)],
    );
}

#[test]
fn prefill_attention_gqa_hd128_and_hd64() {
    check_prefill(31, 128, 8, 2, &[(100, 100), (33, 190)]);
    check_prefill(32, 64, 8, 1, &[(65, 65), (17, 1000)]);
}

/// One head rotated by RoPE (rotate-half layout) at `pos`, in f64.
fn rope_ref(x: &[f32], pos: u32, inv_freq: &[f32]) -> Vec<f32> {
    let half = x.len() / 2;
    let mut o = vec![0f32; x.len()];
    for i in 0..half {
        let (s, c) = (pos as f64 * inv_freq[i] as f64).sin_cos();
        o[i] = (x[i] as f64 * c - x[i + half] as f64 * s) as f32;
        o[i + half] = (x[i + half] as f64 * c + x[i] as f64 * s) as f32;
    }
    o
}

#[test]
fn rope_kv_rotates_and_writes_the_cache() {
    let Some(g) = gpu() else { return };
    for (seed, head_dim, heads, kv_heads, llama3) in [
        (40u64, 128usize, 6usize, 2usize, false),
        (41, 64, 4, 4, true),
    ] {
        let mut r = rng(seed);
        let (t, bs, num_blocks) = (29, 16, 40);
        let width = (heads + 2 * kv_heads) * head_dim;
        let qkv = rand_f32(&mut r, t * width, 2.0);
        let positions: Vec<u32> = (0..t).map(|_| r.random_range(0..5000)).collect();
        let mut slots: Vec<u32> = (0..(num_blocks * bs) as u32).collect();
        slots.shuffle(&mut r);
        slots.truncate(t);
        slots[3] = u32::MAX; // padding token: no cache write
        let scaling = match llama3 {
            true => RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 256,
            },
            false => RopeScaling::None,
        };
        let inv: Vec<f32> = RopeConfig {
            theta: 500000.0,
            scaling,
        }
        .inv_freqs(head_dim)
        .into_iter()
        .map(|f| f as f32)
        .collect();
        let n_cache = num_blocks * kv_heads * bs * head_dim;
        let (qb, pb, sb, ib) = (
            dev(&g, &qkv),
            dev(&g, &positions),
            dev(&g, &slots),
            dev(&g, &inv),
        );
        let (qo, kc, vc) = (
            poisoned::<bf16>(&g, t * heads * head_dim),
            poisoned::<bf16>(&g, n_cache),
            poisoned::<bf16>(&g, n_cache),
        );
        let p = RopeKvParams {
            qkv: qb.ptr(),
            positions: pb.ptr(),
            slots: sb.ptr(),
            inv_freq: ib.ptr(),
            q_out: qo.ptr(),
            k_cache: kc.ptr(),
            v_cache: vc.ptr(),
            num_tokens: t as i32,
            num_heads: heads as i32,
            num_kv_heads: kv_heads as i32,
            head_dim: head_dim as i32,
            block_size: bs as i32,
        };
        unsafe { kernels::rope_kv(&g, &p).unwrap() };
        let (q_got, k_got, v_got) = (
            read_bf16(&g, &qo, t * heads * head_dim),
            read_bf16(&g, &kc, n_cache),
            read_bf16(&g, &vc, n_cache),
        );
        let f = &qkv;
        let rot = |x: &[f32], pos: u32| rope_ref(x, pos, &inv);
        let layout = Cache {
            k: vec![],
            v: vec![],
            kv_heads,
            block_size: bs,
            head_dim,
        };
        let mut written = vec![false; n_cache];
        for i in 0..t {
            let row = &f[i * width..(i + 1) * width];
            for h in 0..heads {
                let o = (i * heads + h) * head_dim;
                assert_close(
                    &format!("rope q token {i} head {h}"),
                    &q_got[o..o + head_dim],
                    &rot(&row[h * head_dim..(h + 1) * head_dim], positions[i]),
                    8e-3,
                );
            }
            if slots[i] == u32::MAX {
                continue;
            }
            for kh in 0..kv_heads {
                let o = layout.offset(slots[i] as usize, kh);
                let k_in = &row[(heads + kh) * head_dim..(heads + kh + 1) * head_dim];
                assert_close(
                    &format!("rope k token {i} kv head {kh}"),
                    &k_got[o..o + head_dim],
                    &rot(k_in, positions[i]),
                    8e-3,
                );
                let v_in = &row
                    [(heads + kv_heads + kh) * head_dim..(heads + kv_heads + kh + 1) * head_dim];
                let v_bf16: Vec<f32> = v_in.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
                assert_eq!(&v_got[o..o + head_dim], &v_bf16[..], "v token {i}");
                written[o..o + head_dim].iter_mut().for_each(|w| *w = true);
            }
        }
        assert!(
            k_got.iter().zip(&written).all(|(x, w)| *w || x.is_nan()),
            "k written outside the slot mapping"
        );
        assert!(
            v_got.iter().zip(&written).all(|(x, w)| *w || x.is_nan()),
            "v written outside the slot mapping"
        );
    }
}

#[test]
fn gemm_bf16_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut r = rng(50);
    let (m, n, k) = (37, 301, 200);
    let x = rand_bf16(&mut r, m * k, 1.0);
    let w = rand_bf16(&mut r, n * k, 1.0);
    let (xf, wf) = (to_f32(&x), to_f32(&w));
    let want: Vec<f32> = (0..m * n)
        .map(|i| {
            let (a, b) = (i / n, i % n);
            (0..k)
                .map(|j| xf[a * k + j] as f64 * wf[b * k + j] as f64)
                .sum::<f64>() as f32
        })
        .collect();
    let (xb, wb) = (dev(&g, &x), dev(&g, &w));
    let y16 = poisoned::<bf16>(&g, m * n);
    let y32 = poisoned::<f32>(&g, m * n);
    unsafe {
        gemm::linear(&g, xb.ptr(), wb.ptr(), y16.ptr(), m, n, k, false).unwrap();
        gemm::linear(&g, xb.ptr(), wb.ptr(), y32.ptr(), m, n, k, true).unwrap();
    }
    assert_close("gemm bf16 out", &read_bf16(&g, &y16, m * n), &want, 8e-3);
    assert_close("gemm f32 out", &read::<f32>(&g, &y32, m * n), &want, 1e-4);
}

#[test]
fn gemv_matches_reference_for_each_row_count() {
    let Some(g) = gpu() else { return };
    let mut r = rng(51);
    let (n, k) = (1003, 1336);
    let w = rand_bf16(&mut r, n * k, 1.0);
    let wb = dev(&g, &w);
    let wf = to_f32(&w);
    for m in 1..=GEMV_MAX_M {
        let x = rand_bf16(&mut r, m * k, 1.0);
        let xf = to_f32(&x);
        let want: Vec<f32> = (0..m * n)
            .map(|i| {
                let (a, b) = (i / n, i % n);
                (0..k)
                    .map(|j| xf[a * k + j] as f64 * wf[b * k + j] as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let xb = dev(&g, &x);
        // Every split: 1003 rows leave the last CTA part empty, 167 chunks per row leave lanes idle.
        for split in [1, 2, 4, 8] {
            let (y16, y32) = (poisoned::<bf16>(&g, m * n), poisoned::<f32>(&g, m * n));
            let p = GemvParams {
                x: xb.ptr(),
                w: wb.ptr(),
                y: y16.ptr(),
                y32: 0,
                m: m as i32,
                n: n as i32,
                k: k as i32,
                split,
            };
            unsafe {
                kernels::gemv(&g, &p).unwrap();
                kernels::gemv(
                    &g,
                    &GemvParams {
                        y: 0,
                        y32: y32.ptr(),
                        ..p
                    },
                )
                .unwrap();
            }
            assert_close(
                &format!("gemv m={m} split {split} bf16"),
                &read_bf16(&g, &y16, m * n),
                &want,
                8e-3,
            );
            assert_close(
                &format!("gemv m={m} split {split} f32"),
                &read::<f32>(&g, &y32, m * n),
                &want,
                1e-5,
            );
        }
    }
}

/// Warps per row for the fused gemv tests' row counts 1..=4: each split once.
const SPLITS: [i32; GEMV_MAX_M] = [8, 1, 4, 2];

/// y[m, n] = x[m, k] · w[n, k]ᵀ in f64.
fn matmul_ref(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    (0..m * n)
        .map(|i| {
            let (a, b) = (i / n, i % n);
            (0..k)
                .map(|j| x[a * k + j] as f64 * w[b * k + j] as f64)
                .sum::<f64>() as f32
        })
        .collect()
}

#[test]
fn gemv_silu_matches_reference_for_each_row_count() {
    let Some(g) = gpu() else { return };
    let mut r = rng(52);
    let (inter, k) = (701, 1336);
    let w = rand_bf16(&mut r, 2 * inter * k, 0.1);
    let (wb, wf) = (dev(&g, &w), to_f32(&w));
    for m in 1..=GEMV_MAX_M {
        let x = rand_bf16(&mut r, m * k, 1.0);
        let gu = matmul_ref(&to_f32(&x), &wf, m, 2 * inter, k);
        let want: Vec<f32> = (0..m * inter)
            .map(|i| {
                let (t, j) = (i / inter, i % inter);
                let (gate, up) = (
                    gu[t * 2 * inter + j] as f64,
                    gu[t * 2 * inter + inter + j] as f64,
                );
                (gate / (1.0 + (-gate).exp()) * up) as f32
            })
            .collect();
        let xb = dev(&g, &x);
        let out = poisoned::<bf16>(&g, m * inter);
        let p = GemvSiluParams {
            x: xb.ptr(),
            w: wb.ptr(),
            out: out.ptr(),
            m: m as i32,
            inter: inter as i32,
            k: k as i32,
            split: SPLITS[m - 1],
        };
        unsafe { kernels::gemv_silu(&g, &p).unwrap() };
        assert_close(
            &format!("gemv_silu m={m} split {}", p.split),
            &read_bf16(&g, &out, m * inter),
            &want,
            8e-3,
        );
    }
}

#[test]
fn gemv_qkv_rope_projects_rotates_and_writes_the_cache() {
    let Some(g) = gpu() else { return };
    for (seed, head_dim, heads, kv_heads) in [(53u64, 128usize, 6usize, 2usize), (54, 64, 4, 4)] {
        let mut r = rng(seed);
        let (k, bs, num_blocks) = (520, 16, 24);
        let width = (heads + 2 * kv_heads) * head_dim;
        let w = rand_bf16(&mut r, width * k, 0.1);
        let wb = dev(&g, &w);
        let inv: Vec<f32> = RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::None,
        }
        .inv_freqs(head_dim)
        .into_iter()
        .map(|f| f as f32)
        .collect();
        let ib = dev(&g, &inv);
        let rot = |x: &[f32], pos: u32| rope_ref(x, pos, &inv);
        let layout = Cache {
            k: vec![],
            v: vec![],
            kv_heads,
            block_size: bs,
            head_dim,
        };
        let n_cache = num_blocks * kv_heads * bs * head_dim;
        for m in 1..=GEMV_MAX_M {
            let x = rand_bf16(&mut r, m * k, 1.0);
            let qkv = matmul_ref(&to_f32(&x), &to_f32(&w), m, width, k);
            let positions: Vec<u32> = (0..m).map(|_| r.random_range(0..4000)).collect();
            let mut slots: Vec<u32> = (0..(num_blocks * bs) as u32).collect();
            slots.shuffle(&mut r);
            slots.truncate(m);
            if m == 3 {
                slots[1] = u32::MAX; // padding token: no cache write
            }
            let (xb, pb, sb) = (dev(&g, &x), dev(&g, &positions), dev(&g, &slots));
            let (qo, kc, vc) = (
                poisoned::<bf16>(&g, m * heads * head_dim),
                poisoned::<bf16>(&g, n_cache),
                poisoned::<bf16>(&g, n_cache),
            );
            let p = GemvQkvRopeParams {
                x: xb.ptr(),
                w: wb.ptr(),
                positions: pb.ptr(),
                slots: sb.ptr(),
                inv_freq: ib.ptr(),
                q_out: qo.ptr(),
                k_cache: kc.ptr(),
                v_cache: vc.ptr(),
                m: m as i32,
                k: k as i32,
                num_heads: heads as i32,
                num_kv_heads: kv_heads as i32,
                head_dim: head_dim as i32,
                block_size: bs as i32,
                split: SPLITS[m - 1],
            };
            unsafe { kernels::gemv_qkv_rope(&g, &p).unwrap() };
            let (q_got, k_got, v_got) = (
                read_bf16(&g, &qo, m * heads * head_dim),
                read_bf16(&g, &kc, n_cache),
                read_bf16(&g, &vc, n_cache),
            );
            let mut written = vec![false; n_cache];
            for t in 0..m {
                let row = &qkv[t * width..(t + 1) * width];
                for h in 0..heads {
                    let o = (t * heads + h) * head_dim;
                    assert_close(
                        &format!("fused q m={m} token {t} head {h}"),
                        &q_got[o..o + head_dim],
                        &rot(&row[h * head_dim..(h + 1) * head_dim], positions[t]),
                        8e-3,
                    );
                }
                if slots[t] == u32::MAX {
                    continue;
                }
                for kh in 0..kv_heads {
                    let o = layout.offset(slots[t] as usize, kh);
                    let kr = (heads + kh) * head_dim;
                    let vr = (heads + kv_heads + kh) * head_dim;
                    assert_close(
                        &format!("fused k m={m} token {t} kv head {kh}"),
                        &k_got[o..o + head_dim],
                        &rot(&row[kr..kr + head_dim], positions[t]),
                        8e-3,
                    );
                    assert_close(
                        &format!("fused v m={m} token {t} kv head {kh}"),
                        &v_got[o..o + head_dim],
                        &row[vr..vr + head_dim],
                        8e-3,
                    );
                    written[o..o + head_dim].iter_mut().for_each(|w| *w = true);
                }
            }
            assert!(
                k_got
                    .iter()
                    .chain(&v_got)
                    .zip(written.iter().chain(&written))
                    .all(|(x, w)| *w || x.is_nan()),
                "fused m={m}: K/V written outside the slot mapping"
            );
        }
    }
}

#[test]
fn fill_uniform_spans_its_range() {
    let Some(g) = gpu() else { return };
    let n = 1_000_003;
    let out = poisoned::<bf16>(&g, n);
    let p = FillParams {
        out: out.ptr(),
        n: n as u64,
        seed: 9,
        scale: 0.5,
        offset: 1.0,
    };
    unsafe { kernels::fill_uniform(&g, &p).unwrap() };
    let v = read_bf16(&g, &out, n);
    assert!(v.iter().all(|x| (0.5..=1.5).contains(x)), "out of range");
    let mean = v.iter().map(|x| *x as f64).sum::<f64>() / n as f64;
    assert!((mean - 1.0).abs() < 2e-3, "mean {mean}");
    let distinct: std::collections::HashSet<u16> =
        v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect();
    assert!(distinct.len() > 100, "{} distinct values", distinct.len());
}

fn sample_args(p: &SamplingParams, seed: u64, index: u64) -> SampleArgs {
    SampleArgs {
        seed,
        output_index: index,
        temperature: p.temperature,
        top_p: p.top_p,
        min_p: p.min_p,
        top_k: p.top_k as i32,
    }
}

/// Runs the sampler kernel on `rows` of logits; returns (tokens, logprobs).
fn run_sample(g: &Gpu, logits: &[f32], vocab: usize, args: &[SampleArgs]) -> (Vec<i32>, Vec<f32>) {
    let n = args.len();
    let (lb, ab) = (dev(g, logits), dev(g, args));
    let (tb, pb) = (poisoned::<i32>(g, n), poisoned::<f32>(g, n));
    let p = SampleParams {
        logits: lb.ptr(),
        args: ab.ptr(),
        tokens: tb.ptr(),
        logprobs: pb.ptr(),
        num_rows: n as i32,
        vocab: vocab as i32,
    };
    unsafe { kernels::sample(g, &p).unwrap() };
    (read(g, &tb, n), read(g, &pb, n))
}

fn log_softmax_at(logits: &[f32], t: usize) -> f32 {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|l| (*l as f64 - m).exp()).sum();
    (logits[t] as f64 - m - z.ln()) as f32
}

#[test]
fn sampling_greedy_and_filters_match_the_cpu_sampler() {
    let Some(g) = gpu() else { return };
    let mut r = rng(60);
    let vocab = 32003;
    let variants: Vec<SamplingParams> = vec![
        SamplingParams::greedy(1),
        SamplingParams {
            temperature: 0.8,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 5,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.3,
            min_p: 0.2,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.8,
            min_p: 0.05,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        },
    ];
    let rows = variants.len() * 9;
    // Peaked logits so the filters bite: a few large values over noise.
    let mut logits = rand_f32(&mut r, rows * vocab, 3.0);
    for row in logits.chunks_mut(vocab) {
        for _ in 0..20 {
            row[r.random_range(0..vocab)] += r.random_range(4.0..9.0);
        }
    }
    let args: Vec<SampleArgs> = (0..rows)
        .map(|i| {
            sample_args(
                &variants[i % variants.len()],
                1000 + i as u64,
                (i * 7) as u64,
            )
        })
        .collect();
    let (tokens, logprobs) = run_sample(&g, &logits, vocab, &args);
    let mut sampler = Sampler::new();
    for i in 0..rows {
        let p = &variants[i % variants.len()];
        let row = &logits[i * vocab..(i + 1) * vocab];
        let tok = tokens[i] as usize;
        assert!(tok < vocab, "row {i}: token {tok}");
        assert!(
            (logprobs[i] - log_softmax_at(row, tok)).abs() < 1e-3,
            "row {i}: logprob {} vs {}",
            logprobs[i],
            log_softmax_at(row, tok)
        );
        if p.is_greedy() {
            assert_eq!(tok as u32, argmax(row).0, "row {i}: greedy");
        } else {
            let (_, m) = argmax(row);
            let kept: Vec<u32> = sampler
                .filtered_probs(row, p, m)
                .iter()
                .map(|c| c.0)
                .collect();
            assert!(
                kept.contains(&(tok as u32)),
                "row {i} ({p:?}): token {tok} is not among the {} kept",
                kept.len()
            );
        }
    }
    // Same (seed, index) gives the same token in another batch at another row.
    let perm: Vec<usize> = (0..rows).rev().collect();
    let logits2: Vec<f32> = perm
        .iter()
        .flat_map(|&i| logits[i * vocab..(i + 1) * vocab].to_vec())
        .collect();
    let args2: Vec<SampleArgs> = perm.iter().map(|&i| args[i]).collect();
    let (tokens2, _) = run_sample(&g, &logits2, vocab, &args2);
    for (j, &i) in perm.iter().enumerate() {
        assert_eq!(tokens2[j], tokens[i], "row {i} changed with batch order");
    }
}

#[test]
fn sampling_follows_the_filtered_distribution() {
    let Some(g) = gpu() else { return };
    let mut r = rng(61);
    let vocab = 50;
    let row = rand_f32(&mut r, vocab, 2.5);
    let p = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        top_k: 20,
        ..Default::default()
    };
    let n = 20000;
    let logits: Vec<f32> = (0..n).flat_map(|_| row.clone()).collect();
    let args: Vec<SampleArgs> = (0..n).map(|i| sample_args(&p, 5, i as u64)).collect();
    let (tokens, _) = run_sample(&g, &logits, vocab, &args);
    let mut sampler = Sampler::new();
    let (_, m) = argmax(&row);
    let kept = sampler.filtered_probs(&row, &p, m).to_vec();
    let total: f32 = kept.iter().map(|c| c.1).sum();
    let mut counts = vec![0usize; vocab];
    tokens.iter().for_each(|&t| counts[t as usize] += 1);
    for &(t, w) in &kept {
        let want = (w / total) as f64;
        let got = counts[t as usize] as f64 / n as f64;
        let sd = (want * (1.0 - want) / n as f64).sqrt();
        assert!(
            (got - want).abs() < 5.0 * sd + 1e-3,
            "token {t}: frequency {got:.4}, probability {want:.4}"
        );
    }
    let outside: usize = (0..vocab)
        .filter(|t| !kept.iter().any(|c| c.0 as usize == *t))
        .map(|t| counts[t])
        .sum();
    assert_eq!(outside, 0, "tokens outside the filtered set were drawn");
}

// ---- The GEMM prefill path (src/executor/cuda/prefill_gemm.rs) ----

/// A prefill batch over a random paged cache: per sequence (query tokens, context).
struct PrefillBatch {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    seqs: Vec<(usize, usize)>,
    cache: Cache,
    bt: Vec<i32>,
    max_blocks: usize,
    q: Vec<bf16>,
    q_start: Vec<usize>,
    tokens: usize,
}

impl PrefillBatch {
    fn random(
        r: &mut ChaCha8Rng,
        head_dim: usize,
        heads: usize,
        kv_heads: usize,
        seqs: &[(usize, usize)],
    ) -> PrefillBatch {
        let bs = 16;
        let ctx: Vec<usize> = seqs.iter().map(|s| s.1).collect();
        let num_blocks = ctx.iter().map(|c| c.div_ceil(bs)).sum::<usize>() + 5;
        let cache = Cache::random(r, num_blocks, kv_heads, bs, head_dim);
        let (bt, max_blocks) = block_tables(r, &ctx, bs, num_blocks);
        let mut q_start = Vec::new();
        let mut t = 0;
        for &(qlen, c) in seqs {
            assert!(qlen <= c);
            q_start.push(t);
            t += qlen;
        }
        PrefillBatch {
            heads,
            kv_heads,
            head_dim,
            block_size: bs,
            seqs: seqs.to_vec(),
            q: rand_bf16(r, t * heads * head_dim, 1.0),
            cache,
            bt,
            max_blocks,
            q_start,
            tokens: t,
        }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    fn row_elems(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The reference attention output of every token row, [tokens, heads, head_dim].
    fn reference(&self) -> Vec<f32> {
        let qf = to_f32(&self.q);
        let (hd, group) = (self.head_dim, self.heads / self.kv_heads);
        let mut out = vec![0f32; self.tokens * self.row_elems()];
        for (s, &(qlen, c)) in self.seqs.iter().enumerate() {
            for i in 0..qlen {
                for h in 0..self.heads {
                    let o = ((self.q_start[s] + i) * self.heads + h) * hd;
                    let want = attend_ref(
                        &qf[o..o + hd],
                        &self.cache,
                        &self.bt[s * self.max_blocks..],
                        h / group,
                        c - qlen + i + 1,
                        self.scale() as f64,
                    );
                    out[o..o + hd].copy_from_slice(&want);
                }
            }
        }
        out
    }
}

/// The batch's buffers on the GPU, and runs of each path on chosen sequences into `out`.
struct PrefillRun<'a> {
    g: &'a Gpu,
    b: &'a PrefillBatch,
    q: DevBuf,
    k_cache: DevBuf,
    v_cache: DevBuf,
    q_start: DevBuf,
    q_len: DevBuf,
    ctx: DevBuf,
    bt: DevBuf,
}

impl<'a> PrefillRun<'a> {
    fn new(g: &'a Gpu, b: &'a PrefillBatch) -> Self {
        let q_start: Vec<i32> = b.q_start.iter().map(|&x| x as i32).collect();
        let q_len: Vec<i32> = b.seqs.iter().map(|s| s.0 as i32).collect();
        let ctx: Vec<i32> = b.seqs.iter().map(|s| s.1 as i32).collect();
        PrefillRun {
            g,
            b,
            q: dev(g, &b.q),
            k_cache: dev(g, &b.cache.k),
            v_cache: dev(g, &b.cache.v),
            q_start: dev(g, &q_start),
            q_len: dev(g, &q_len),
            ctx: dev(g, &ctx),
            bt: dev(g, &b.bt),
        }
    }

    fn flash(&self, seqs: &[usize], out: &DevBuf) {
        let (mut tile_seq, mut tile_q0) = (Vec::new(), Vec::new());
        for &s in seqs {
            for q0 in (0..self.b.seqs[s].0).step_by(PREFILL_TILE) {
                tile_seq.push(s as i32);
                tile_q0.push(q0 as i32);
            }
        }
        let (ts, tq) = (dev(self.g, &tile_seq), dev(self.g, &tile_q0));
        let p = PrefillAttnParams {
            q: self.q.ptr(),
            k_cache: self.k_cache.ptr(),
            v_cache: self.v_cache.ptr(),
            tile_seq: ts.ptr(),
            tile_q0: tq.ptr(),
            q_start: self.q_start.ptr(),
            q_len: self.q_len.ptr(),
            context_lens: self.ctx.ptr(),
            block_tables: self.bt.ptr(),
            out: out.ptr(),
            num_tiles: tile_seq.len() as i32,
            num_heads: self.b.heads as i32,
            num_kv_heads: self.b.kv_heads as i32,
            block_size: self.b.block_size as i32,
            max_blocks: self.b.max_blocks as i32,
            scale: self.b.scale(),
        };
        unsafe { kernels::prefill_attn(self.g, &p, self.b.head_dim).unwrap() };
        self.g.sync().unwrap();
    }

    /// The whole GEMM path on `seqs`, with scratch placed by the backend's planner and poisoned.
    fn gemm(&self, seqs: &[usize], out: &DevBuf) {
        let b = self.b;
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
        let (hd, h) = (b.head_dim, b.heads);
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
            k_cache: self.k_cache.ptr(),
            v_cache: self.v_cache.ptr(),
            q_lens: self.q_len.ptr(),
            context_lens: self.ctx.ptr(),
            block_tables: self.bt.ptr(),
            gemm_seq: gs.ptr(),
            gemm_key0: gk.ptr(),
            gemm_s0: gs0.ptr(),
            k_buf: k_buf.ptr(),
            v_buf: v_buf.ptr(),
            scores: scores.ptr(),
            seqs: &placed,
            num_heads: h,
            num_kv_heads: b.kv_heads,
            head_dim: hd,
            block_size: b.block_size,
            max_blocks: b.max_blocks,
            scale: b.scale(),
        };
        unsafe { gemm_attention(self.g, &p).unwrap() };
        self.g.sync().unwrap();
    }
}

/// Token rows of `seqs` in `v` ([tokens, heads, head_dim]).
fn rows_of(b: &PrefillBatch, v: &[f32], seqs: &[usize]) -> Vec<f32> {
    let e = b.row_elems();
    seqs.iter()
        .flat_map(|&s| v[b.q_start[s] * e..(b.q_start[s] + b.seqs[s].0) * e].to_vec())
        .collect()
}

/// `seqs`: (query tokens, context, on the GEMM path). Checks, per head and query, (1) a mixed
/// batch (GEMM path on some sequences, flash kernel on the others, one output) against the CPU
/// reference; (2) the GEMM path alone writes its rows only, and they agree with the flash kernel
/// on the same inputs.
fn check_gemm_prefill(
    seed: u64,
    head_dim: usize,
    heads: usize,
    kv_heads: usize,
    seqs: &[(usize, usize, bool)],
) {
    let Some(g) = gpu() else { return };
    let mut r = rng(seed);
    let shape: Vec<(usize, usize)> = seqs.iter().map(|s| (s.0, s.1)).collect();
    let b = PrefillBatch::random(&mut r, head_dim, heads, kv_heads, &shape);
    let run = PrefillRun::new(&g, &b);
    let on_gemm: Vec<usize> = (0..seqs.len()).filter(|&s| seqs[s].2).collect();
    let on_flash: Vec<usize> = (0..seqs.len()).filter(|&s| !seqs[s].2).collect();
    let n = b.tokens * b.row_elems();
    let want = b.reference();
    let group = heads / kv_heads;

    let mixed = poisoned::<bf16>(&g, n);
    run.gemm(&on_gemm, &mixed);
    if !on_flash.is_empty() {
        run.flash(&on_flash, &mixed);
    }
    let got = read_bf16(&g, &mixed, n);
    for (s, &(qlen, c, path)) in seqs.iter().enumerate() {
        for i in 0..qlen {
            for h in 0..heads {
                let o = ((b.q_start[s] + i) * heads + h) * head_dim;
                assert_close(
                    &format!(
                        "mixed batch hd{head_dim} g{group} seq {s} ({}, q {qlen}, ctx {c}) query {i} head {h}",
                        if path { "gemm" } else { "flash" }
                    ),
                    &got[o..o + head_dim],
                    &want[o..o + head_dim],
                    1.5e-2,
                );
            }
        }
    }

    let gemm_only = poisoned::<bf16>(&g, n);
    run.gemm(&on_gemm, &gemm_only);
    let flash_all = poisoned::<bf16>(&g, n);
    run.flash(&(0..seqs.len()).collect::<Vec<_>>(), &flash_all);
    let (gg, ff) = (read_bf16(&g, &gemm_only, n), read_bf16(&g, &flash_all, n));
    assert!(
        rows_of(&b, &gg, &on_flash).iter().all(|x| x.is_nan()),
        "the GEMM path wrote rows of flash-path sequences"
    );
    for &s in &on_gemm {
        assert_close(
            &format!(
                "gemm path vs flash kernel, hd{head_dim} g{group} seq {s} {:?}",
                seqs[s]
            ),
            &rows_of(&b, &gg, &[s]),
            &rows_of(&b, &ff, &[s]),
            1e-2,
        );
    }
}

#[test]
fn gemm_prefill_mixed_with_flash_mha_hd128() {
    // Fresh prompts, cached prefixes (ctx > q), odd sizes, one over 2 softmax chunks of 32.
    check_gemm_prefill(
        70,
        128,
        4,
        4,
        &[
            (70, 70, true),
            (5, 200, true),
            (130, 300, false),
            (64, 64, false),
            (2, 2, true),
            (33, 95, true),
        ],
    );
}

#[test]
fn gemm_prefill_gqa_groups_4_8_and_3() {
    check_gemm_prefill(
        71,
        128,
        8,
        2,
        &[
            (100, 100, true),
            (33, 190, true),
            (17, 17, false),
            (129, 129, true),
        ],
    );
    check_gemm_prefill(
        72,
        64,
        8,
        1,
        &[(65, 65, true), (17, 1000, false), (3, 41, true)],
    );
    check_gemm_prefill(
        73,
        64,
        6,
        2,
        &[(37, 37, true), (50, 80, false), (9, 120, true)],
    );
}

#[test]
fn gemm_prefill_alone() {
    // Every sequence on the GEMM path (no flash launch in the mixed run).
    check_gemm_prefill(
        74,
        128,
        4,
        2,
        &[(3, 3, true), (250, 256, true), (7, 19, true)],
    );
}

#[test]
fn kv_gather_copies_contexts_per_query_head() {
    let Some(g) = gpu() else { return };
    for (seed, head_dim, heads, kv_heads) in [(80u64, 128usize, 4usize, 4usize), (81, 64, 6, 2)] {
        let mut r = rng(seed);
        let bs = 16;
        let ctx = [45usize, 1, 300, 17, 64];
        let num_blocks = ctx.iter().map(|c| c.div_ceil(bs)).sum::<usize>() + 3;
        let cache = Cache::random(&mut r, num_blocks, kv_heads, bs, head_dim);
        let (bt, max_blocks) = block_tables(&mut r, &ctx, bs, num_blocks);
        // Entries name sequences out of order and skip one (it is on the flash path).
        let entries = [3usize, 0, 4, 2];
        let mut key0 = Vec::new();
        let mut keys = 0;
        for &s in &entries {
            key0.push(keys as i32);
            keys += ctx[s];
        }
        let row = heads * head_dim;
        let slack = 7; // rows past the last entry must stay untouched
        let (k_out, v_out) = (
            poisoned::<bf16>(&g, (keys + slack) * row),
            poisoned::<bf16>(&g, (keys + slack) * row),
        );
        let entries_i: Vec<i32> = entries.iter().map(|&s| s as i32).collect();
        let ctx_i: Vec<i32> = ctx.iter().map(|&c| c as i32).collect();
        let bufs = [
            dev(&g, &cache.k),
            dev(&g, &cache.v),
            dev(&g, &entries_i),
            dev(&g, &key0),
            dev(&g, &ctx_i),
            dev(&g, &bt),
        ];
        let p = KvGatherParams {
            k_cache: bufs[0].ptr(),
            v_cache: bufs[1].ptr(),
            gemm_seq: bufs[2].ptr(),
            gemm_key0: bufs[3].ptr(),
            context_lens: bufs[4].ptr(),
            block_tables: bufs[5].ptr(),
            k_out: k_out.ptr(),
            v_out: v_out.ptr(),
            num_gemm: entries.len() as i32,
            num_heads: heads as i32,
            num_kv_heads: kv_heads as i32,
            head_dim: head_dim as i32,
            block_size: bs as i32,
            max_blocks: max_blocks as i32,
        };
        let max_ctx = entries.iter().map(|&s| ctx[s]).max().unwrap();
        unsafe { kernels::kv_gather(&g, &p, max_ctx).unwrap() };
        let (kg, vg): (Vec<u16>, Vec<u16>) = (
            read(&g, &k_out, (keys + slack) * row),
            read(&g, &v_out, (keys + slack) * row),
        );
        let group = heads / kv_heads;
        for (e, &s) in entries.iter().enumerate() {
            let base = key0[e] as usize * row;
            for h in 0..heads {
                for j in 0..ctx[s] {
                    let slot = bt[s * max_blocks + j / bs] as usize * bs + j % bs;
                    let o = base + (h * ctx[s] + j) * head_dim;
                    let bits = |x: &[bf16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        &kg[o..o + head_dim],
                        &bits(cache.k_row(slot, h / group))[..],
                        "k: entry {e} (seq {s}) head {h} key {j}"
                    );
                    assert_eq!(
                        &vg[o..o + head_dim],
                        &bits(cache.v_row(slot, h / group))[..],
                        "v: entry {e} (seq {s}) head {h} key {j}"
                    );
                }
            }
        }
        assert!(
            kg[keys * row..]
                .iter()
                .chain(&vg[keys * row..])
                .all(|&x| x == 0xffff),
            "written past the last entry"
        );
    }
}

#[test]
fn causal_softmax_matches_reference_out_of_and_in_place() {
    let Some(g) = gpu() else { return };
    let mut r = rng(90);
    let heads = 3;
    // (query tokens, context): fresh, cached prefix, one key, odd sizes, several 32-key chunks.
    let seqs = [
        (7usize, 7usize),
        (5, 200),
        (1, 1),
        (33, 33),
        (40, 97),
        (2, 130),
    ];
    let mut s0 = Vec::new();
    let mut total = 0;
    for &(q, c) in &seqs {
        s0.push(total as i32);
        total += heads * q * scores_ld(c);
    }
    // Peaked scores so the softmax is far from uniform.
    let scores = rand_f32(&mut r, total, 12.0);
    let scale = 0.37f32;
    let entries: Vec<i32> = (0..seqs.len() as i32).rev().collect(); // entries out of seq order
    let s0_e: Vec<i32> = entries.iter().map(|&s| s0[s as usize]).collect();
    let q_len: Vec<i32> = seqs.iter().map(|s| s.0 as i32).collect();
    let ctx: Vec<i32> = seqs.iter().map(|s| s.1 as i32).collect();
    let bufs = [
        dev(&g, &scores),
        dev(&g, &entries),
        dev(&g, &s0_e),
        dev(&g, &q_len),
        dev(&g, &ctx),
    ];
    let probs = poisoned::<f32>(&g, total); // same bytes as the scores
    let p = CausalSoftmaxParams {
        scores: bufs[0].ptr(),
        probs: probs.ptr(),
        gemm_seq: bufs[1].ptr(),
        gemm_s0: bufs[2].ptr(),
        q_len: bufs[3].ptr(),
        context_lens: bufs[4].ptr(),
        num_gemm: entries.len() as i32,
        num_heads: heads as i32,
        scale,
    };
    let max_q = seqs.iter().map(|s| s.0).max().unwrap();
    unsafe { kernels::causal_softmax(&g, &p, max_q).unwrap() };
    let out: Vec<u16> = read(&g, &probs, 2 * total);
    // In place over a copy of the scores: the same bits.
    let inplace = dev(&g, &scores);
    let p2 = CausalSoftmaxParams {
        scores: inplace.ptr(),
        probs: inplace.ptr(),
        ..p
    };
    unsafe { kernels::causal_softmax(&g, &p2, max_q).unwrap() };
    let out2: Vec<u16> = read(&g, &inplace, 2 * total);
    for (s, &(q, c)) in seqs.iter().enumerate() {
        let ld = scores_ld(c);
        for h in 0..heads {
            for i in 0..q {
                let row = s0[s] as usize + (h * q + i) * ld;
                let visible = c - q + i + 1;
                let x: Vec<f64> = scores[row..row + visible]
                    .iter()
                    .map(|v| *v as f64 * scale as f64)
                    .collect();
                let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
                let mut want: Vec<f32> = x.iter().map(|v| ((v - m).exp() / z) as f32).collect();
                want.resize(c, 0.0);
                let bits = &out[2 * row..2 * row + c];
                let got: Vec<f32> = bits.iter().map(|b| bf16::from_bits(*b).to_f32()).collect();
                let what = format!("softmax seq {s} (q {q}, ctx {c}) head {h} row {i}");
                assert_close(&what, &got, &want, 8e-3);
                assert!(
                    got[visible..].iter().all(|&v| v == 0.0),
                    "{what}: masked keys not zero"
                );
                assert_eq!(
                    bits,
                    &out2[2 * row..2 * row + c],
                    "{what}: in place differs"
                );
            }
        }
    }
}
