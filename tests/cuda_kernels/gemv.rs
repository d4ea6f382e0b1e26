//! `gemv` (one warp per row or split over k, bf16 or fp32 out) and its fused variants
//! `gemv_silu` and `gemv_qkv_rope`, for every row count the gemv path takes.

use brook::executor::cuda::device::Gpu;
use brook::executor::cuda::kernels::{
    self, GemvParams, GemvQkvRopeParams, GemvSiluParams, GEMV_MAX_M,
};
use brook::executor::cuda::GemvSmem;
use brook::model::config::RopeScaling;
use half::bf16;

use crate::harness::{
    assert_close, dev, inv_freqs, kv_gpu, matmul_ref, poisoned, rand_bf16, read, read_bf16, rng,
    setup, to_f32,
};
use crate::paged::KvLayout;
use crate::qkv_write::{QkvDev, QkvWrite};

#[test]
fn gemv_matches_reference_for_each_row_count() {
    let Some((mut g, mut r)) = setup(51) else {
        return;
    };
    g.gemv_bulk = false; // the split kernel; gemv_bulk_* below
    let (n, k) = (1003, 1336);
    let w = rand_bf16(&mut r, n * k, 1.0);
    let wb = dev(&g, &w);
    let wf = to_f32(&w);
    for m in 1..=GEMV_MAX_M {
        let x = rand_bf16(&mut r, m * k, 1.0);
        let want = matmul_ref(&to_f32(&x), &wf, m, n, k);
        let xb = dev(&g, &x);
        // Every split: 1003 rows leave the last CTA part empty, 167 chunks per row leave lanes idle.
        for split in [1, 2, 4, 8] {
            let p = gemv_params(xb.ptr(), wb.ptr(), (m, n, k), split);
            check_both_outputs(
                &g,
                kernels::gemv,
                p,
                &want,
                &format!("gemv m={m} split {split}"),
            );
        }
    }
}

/// The bulk-copy gemv (gemv_bulk.cu) for every row count, on shapes that reach each of its
/// paths: rows that end inside a warp's 512-byte step (k 2,056: 4,112 bytes), a slab of a few
/// stages and one that goes round the 32-stage ring several times (n 12,000: ~91 rows = 92
/// stages a CTA), rows exactly a stage long (k 2,048), and more rows than the SMs' accumulators
/// hold (m 4, n 140,000: more CTAs than SMs), and a slab that goes round the 48-stage deep
/// ring several times (n 30,000: ~228 stages a CTA). Each under every `GemvSmem` (room for the
/// largest x and accumulator; the ring, x and accumulator only; the deep ring at one row,
/// else tight). Where the kernel is not built it checks `gemv`'s fallback instead.
#[test]
fn gemv_bulk_matches_reference() {
    let Some((mut g, mut r)) = setup(57) else {
        return;
    };
    let shapes = [
        (1003, 2056, 1..=GEMV_MAX_M),
        (12000, 2056, 1..=2),
        (5, 2048, 1..=1),
        (140_000, 2048, 4..=4),
        (30_000, 2056, 1..=2),
    ];
    for mode in [GemvSmem::Roomy, GemvSmem::Tight, GemvSmem::Deep] {
        g.gemv_smem = mode;
        for (n, k, ms) in shapes.clone() {
            let w = rand_bf16(&mut r, n * k, 1.0);
            let wb = dev(&g, &w);
            let wf = to_f32(&w);
            for m in ms {
                let takes = kernels::gemv_bulk_grid(&g, m, n, k);
                assert_eq!(takes.is_some(), g.gemv_bulk, "n {n} k {k} m {m}");
                let deep = takes.is_some_and(|c| {
                    mode == GemvSmem::Deep
                        && kernels::gemv_bulk_deep_fits(&g, m, n.div_ceil(c as usize), k)
                });
                // The deep kernels load wherever the bulk ones do (sm_90's 227 KB a CTA).
                assert_eq!(g.gemv_deep, g.gemv_bulk);
                assert_eq!(deep, g.gemv_bulk && mode == GemvSmem::Deep && m == 1);
                let x = rand_bf16(&mut r, m * k, 1.0);
                let want = matmul_ref(&to_f32(&x), &wf, m, n, k);
                let xb = dev(&g, &x);
                let p = gemv_params(xb.ptr(), wb.ptr(), (m, n, k), 1);
                let what = format!(
                    "gemv_bulk m={m} n={n} k={k} {} ({takes:?} CTAs, deep {deep})",
                    mode.as_str()
                );
                check_both_outputs(&g, kernels::gemv, p, &want, &what);
            }
        }
    }
}

/// Rows shorter than a stage, m past `GEMV_MAX_M`, and x past the shared memory kept for it are
/// not the bulk kernel's; a GPU without it (before sm_90) takes no shape.
#[test]
fn gemv_bulk_grid_takes_only_its_shapes() {
    let Some((mut g, _)) = setup(58) else { return };
    let grid = kernels::gemv_bulk_grid;
    let stage = kernels::GEMV_BULK_STAGE_BYTES;
    assert_eq!(grid(&g, 1, 4096, stage / 2 - 8), None);
    assert_eq!(grid(&g, GEMV_MAX_M + 1, 4096, 4096), None);
    assert_eq!(grid(&g, 1, 4096, 4100), None); // not whole 16-byte chunks
    let x_cap = kernels::GEMV_BULK_X_BYTES / 2; // elements of x
    assert_eq!(grid(&g, 4, 4096, x_cap / 4 + 8), None);
    if g.gemv_bulk {
        assert_eq!(grid(&g, 1, 4096, stage / 2), Some(g.num_sms));
        assert_eq!(grid(&g, 4, 4096, x_cap / 4), Some(g.num_sms));
        assert_eq!(grid(&g, 1, 7, 4096), Some(7));
        let cap = kernels::GEMV_BULK_ACC_FLOATS / 4;
        let n = cap * g.num_sms as usize + 1;
        assert_eq!(grid(&g, 4, n, 4096), Some(g.num_sms + 1));
    }
    g.gemv_bulk = false;
    assert_eq!(grid(&g, 1, 4096, 4096), None);
}

/// gemv params over x [m, k] and w [n, k] (bf16; set `w_scale` for e4m3); the outputs are
/// `check_both_outputs`'.
pub fn gemv_params(x: u64, w: u64, (m, n, k): (usize, usize, usize), split: i32) -> GemvParams {
    GemvParams {
        x,
        w,
        y: 0,
        y32: 0,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        split,
        w_scale: 0,
    }
}

/// Runs `launch` (`gemv` or `gemv_fp8`) with `p` (its outputs ignored) into a poisoned bf16 and
/// then a poisoned f32 output, each checked against `want`.
pub fn check_both_outputs(
    g: &Gpu,
    launch: unsafe fn(&Gpu, &GemvParams) -> anyhow::Result<()>,
    p: GemvParams,
    want: &[f32],
    what: &str,
) {
    let (m, n) = (p.m as usize, p.n as usize);
    let (y16, y32) = (poisoned::<bf16>(g, m * n), poisoned::<f32>(g, m * n));
    // SAFETY: the caller's buffers hold p's shapes; the outputs are m x n.
    unsafe {
        launch(
            g,
            &GemvParams {
                y: y16.ptr(),
                y32: 0,
                ..p
            },
        )
        .unwrap();
        launch(
            g,
            &GemvParams {
                y: 0,
                y32: y32.ptr(),
                ..p
            },
        )
        .unwrap();
    }
    assert_close(
        &format!("{what} bf16"),
        &read_bf16(g, &y16, m * n),
        want,
        8e-3,
    );
    assert_close(
        &format!("{what} f32"),
        &read::<f32>(g, &y32, m * n),
        want,
        1e-5,
    );
}

/// Warps per row for the fused gemv tests' row counts 1..=4: each split once.
const SPLITS: [i32; GEMV_MAX_M] = [8, 1, 4, 2];

#[test]
fn gemv_silu_matches_reference_for_each_row_count() {
    let Some((g, mut r)) = setup(52) else { return };
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
    qkv_rope(false);
}

/// The fused write into an e4m3 cache: K and V bytes against the CPU quantizer of the f64
/// reference, but for values within 0.1 % of a rounding boundary (fp32 sums and angles).
#[test]
fn gemv_qkv_rope_writes_an_e4m3_cache() {
    qkv_rope(true);
}

fn qkv_rope(fp8: bool) {
    let Some(g) = kv_gpu(fp8) else { return };
    for (seed, head_dim, heads, kv_heads) in [(53u64, 128usize, 6usize, 2usize), (54, 64, 4, 4)] {
        let mut r = rng(seed);
        let (k, bs, num_blocks) = (520, 16, 24);
        let width = (heads + 2 * kv_heads) * head_dim;
        let w = rand_bf16(&mut r, width * k, 0.1);
        let wb = dev(&g, &w);
        let inv = inv_freqs(10000.0, RopeScaling::None, head_dim);
        let layout = KvLayout {
            kv_heads,
            block_size: bs,
            head_dim,
        };
        for m in 1..=GEMV_MAX_M {
            let x = rand_bf16(&mut r, m * k, 1.0);
            let qkv = matmul_ref(&to_f32(&x), &to_f32(&w), m, width, k);
            let place = (m, 4000, num_blocks);
            let mut write = QkvWrite::random(&mut r, place, heads, layout, inv.clone());
            if m == 3 {
                write.slots[1] = u32::MAX; // padding token: no cache write
            }
            let (xb, d) = (dev(&g, &x), QkvDev::new(&g, &write, num_blocks, fp8));
            let p = GemvQkvRopeParams {
                x: xb.ptr(),
                w: wb.ptr(),
                positions: d.positions.ptr(),
                slots: d.slots.ptr(),
                inv_freq: d.inv_freq.ptr(),
                q_out: d.q_out.ptr(),
                k_cache: d.k_cache.ptr(),
                v_cache: d.v_cache.ptr(),
                m: m as i32,
                k: k as i32,
                num_heads: heads as i32,
                num_kv_heads: kv_heads as i32,
                head_dim: head_dim as i32,
                block_size: bs as i32,
                split: SPLITS[m - 1],
            };
            unsafe { kernels::gemv_qkv_rope(&g, &p).unwrap() };
            // The projection is rounded to bf16 inside the kernel: V within tolerance.
            let what = format!("fused m={m} fp8 {fp8}");
            d.check(&g, &what, &write, &qkv, false, 1e-3);
        }
    }
}
