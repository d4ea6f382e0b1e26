//! `gemv` (one warp per row or split over k, bf16 or fp32 out) and its fused variants
//! `gemv_silu` and `gemv_qkv_rope`, for every row count the gemv path takes.

use brook::executor::cuda::device::Gpu;
use brook::executor::cuda::kernels::{
    self, BulkInput, BulkOutput, GemvParams, GemvQkvRopeParams, GemvSiluParams, GEMV_MAX_M,
};
use brook::model::config::RopeScaling;
use half::bf16;
use rand_chacha::ChaCha8Rng;

use crate::harness::{
    assert_close, dev, inv_freqs, kv_gpu, matmul_ref, poisoned, rand_bf16, rand_f32, read,
    read_bf16, rng, setup, to_f32,
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
/// hold (m 4, n 140,000: more CTAs than SMs); with both rings (32 and 16 stages). Where the
/// kernel is not built it checks `gemv`'s fallback instead.
#[test]
fn gemv_bulk_matches_reference() {
    let Some((mut g, mut r)) = setup(57) else {
        return;
    };
    for (n, k, ms) in [
        (1003, 2056, 1..=GEMV_MAX_M),
        (12000, 2056, 1..=2),
        (5, 2048, 1..=1),
        (140_000, 2048, 4..=4),
    ] {
        let w = rand_bf16(&mut r, n * k, 1.0);
        let wb = dev(&g, &w);
        let wf = to_f32(&w);
        for m in ms {
            let takes = kernels::gemv_bulk_grid(&g, m, n, k);
            assert_eq!(takes.is_some(), g.gemv_bulk, "n {n} k {k} m {m}");
            let x = rand_bf16(&mut r, m * k, 1.0);
            let want = matmul_ref(&to_f32(&x), &wf, m, n, k);
            let xb = dev(&g, &x);
            let p = gemv_params(xb.ptr(), wb.ptr(), (m, n, k), 1);
            // Each ring, the short one with its tight shared memory (x alone past the ring).
            for short in [false, true] {
                use_short_ring(&mut g, short);
                let stages = g.gemv_bulk_stages;
                let what = format!("gemv_bulk m={m} n={n} k={k} ({takes:?} CTAs, {stages} stages)");
                check_both_outputs(&g, kernels::gemv, p, &want, &what);
            }
        }
    }
}

/// The bulk gemv's fused inputs and output (decode's `bulk_fusion`), for every row count: x as
/// rmsnorm(fp32 residual) * weight, x as silu(gate) * up of an fp32 gate|up row, and y added
/// into fp32 rows, each against the separate kernels' arithmetic (add_rmsnorm, silu_mul) done
/// here. 3,001 rows of 4,112 bytes: row ends inside a warp's step, a few stages a CTA; the
/// short ring (16 stages) for 2 and 4 rows.
#[test]
fn gemv_bulk_fused_input_and_output_match_reference() {
    let Some((mut g, mut r)) = bulk_setup(59) else {
        return;
    };
    let (n, k, eps) = (3001, 2056, 1e-5f32);
    let w = rand_bf16(&mut r, n * k, 1.0);
    let (wb, wf) = (dev(&g, &w), to_f32(&w));
    let bulk = |input, output, m| kernels::BulkGemv {
        input,
        w: wb.ptr(),
        output,
        m,
        n,
        k,
    };
    for m in 1..=GEMV_MAX_M {
        // Rows 2 and 4 on the short ring, 1 and 3 on the long one.
        use_short_ring(&mut g, m % 2 == 0);
        // Normalised input: rows of different scales, so a wrong row's norm shows.
        let res: Vec<f32> = (0..m)
            .flat_map(|i| rand_f32(&mut r, k, 0.5 + i as f32))
            .collect();
        let norm_w = rand_bf16(&mut r, k, 1.0);
        let x: Vec<f32> = res
            .chunks(k)
            .flat_map(|row| {
                let ss: f32 = row.iter().map(|v| v * v).sum();
                let inv = 1.0 / (ss / k as f32 + eps).sqrt();
                row.iter()
                    .zip(&norm_w)
                    .map(move |(v, nw)| bf16::from_f32(v * inv * nw.to_f32()).to_f32())
            })
            .collect();
        let (resb, norm_wb) = (dev(&g, &res), dev(&g, &norm_w));
        let input = BulkInput::Norm {
            residual: resb.ptr(),
            weight: norm_wb.ptr(),
            eps,
        };
        let want = matmul_ref(&x, &wf, m, n, k);
        check_bulk_outputs(&g, |o| bulk(input, o, m), &want, &format!("norm m={m}"));

        // SiLU × up input from fp32 gate | up rows.
        let gu = rand_f32(&mut r, m * 2 * k, 4.0);
        let x: Vec<f32> = (0..m * k)
            .map(|i| {
                let (row, j) = (i / k, i % k);
                let (gate, up) = (gu[row * 2 * k + j], gu[row * 2 * k + k + j]);
                bf16::from_f32(gate / (1.0 + (-gate).exp()) * up).to_f32()
            })
            .collect();
        let gub = dev(&g, &gu);
        let want = matmul_ref(&x, &wf, m, n, k);
        let what = format!("silu m={m}");
        check_bulk_outputs(
            &g,
            |o| bulk(BulkInput::GateUp(gub.ptr()), o, m),
            &want,
            &what,
        );

        // Plain x, the product added into fp32 rows that already hold values.
        let x = rand_bf16(&mut r, m * k, 1.0);
        let xb = dev(&g, &x);
        let y0 = rand_f32(&mut r, m * n, 20.0);
        let y = dev(&g, &y0);
        let job = bulk(BulkInput::X(xb.ptr()), BulkOutput::AddF32(y.ptr()), m);
        unsafe { kernels::gemv_bulk(&g, &job).unwrap() };
        let want: Vec<f32> = matmul_ref(&to_f32(&x), &wf, m, n, k)
            .iter()
            .zip(&y0)
            .map(|(p, y)| p + y)
            .collect();
        let what = format!("accumulate m={m}");
        assert_close(&what, &read::<f32>(&g, &y, m * n), &want, 1e-5);
    }
    // A shape the kernel does not take is an error, not a silent fallback.
    let short = kernels::BulkGemv {
        k: 1024,
        ..bulk(BulkInput::X(0), BulkOutput::Bf16(0), 1)
    };
    assert!(unsafe { kernels::gemv_bulk(&g, &short) }.is_err());
}

/// With `gemv_bulk_ordered` the bulk gemv's sums are the same bits every run, on rows that span
/// several stages (k 11,008: the down projection's 5.4 stages a row, whose partial sums shared
/// atomics add in the order the warps arrive), and they are the reference's; both rings.
#[test]
fn gemv_bulk_ordered_repeats_bit_for_bit() {
    let Some((mut g, mut r)) = bulk_setup(60) else {
        return;
    };
    g.gemv_bulk_ordered = true;
    let (n, k) = (4096, 11008);
    let w = rand_bf16(&mut r, n * k, 1.0);
    let (wb, wf) = (dev(&g, &w), to_f32(&w));
    for m in 1..=3 {
        let x = rand_bf16(&mut r, m * k, 1.0);
        let want = matmul_ref(&to_f32(&x), &wf, m, n, k);
        let xb = dev(&g, &x);
        let y = poisoned::<f32>(&g, m * n);
        let mut first: Option<Vec<u32>> = None;
        for run in 0..6 {
            use_short_ring(&mut g, run % 2 == 1);
            g.memset(y.ptr(), 0xff, m * n * 4).unwrap();
            let job = kernels::BulkGemv {
                input: BulkInput::X(xb.ptr()),
                w: wb.ptr(),
                output: BulkOutput::F32(y.ptr()),
                m,
                n,
                k,
            };
            // SAFETY: x is [m, k], w [n, k], y [m, n].
            unsafe { kernels::gemv_bulk(&g, &job).unwrap() };
            let got = read::<f32>(&g, &y, m * n);
            assert_close(&format!("ordered m={m} run {run}"), &got, &want, 1e-5);
            let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            match &first {
                None => first = Some(bits),
                Some(f) => assert!(*f == bits, "m={m}: run {run} differs from run 0"),
            }
        }
    }
}

/// `job(output)` into a poisoned bf16 and then a poisoned f32 output, each against `want`.
fn check_bulk_outputs(
    g: &Gpu,
    job: impl Fn(BulkOutput) -> kernels::BulkGemv,
    want: &[f32],
    what: &str,
) {
    check_outputs(g, want, what, 1e-4, |y, y32| {
        let out = match y32 {
            0 => BulkOutput::Bf16(y),
            _ => BulkOutput::F32(y32),
        };
        // SAFETY: the job's input and weights are live buffers of its shapes; the outputs m x n.
        unsafe { kernels::gemv_bulk(g, &job(out)).unwrap() }
    });
}

/// `setup(seed)` where the GPU has the bulk gemv; None (after saying so) where it has not.
fn bulk_setup(seed: u64) -> Option<(Gpu, ChaCha8Rng)> {
    let (g, r) = setup(seed)?;
    if !g.gemv_bulk {
        eprintln!("skipped: no bulk gemv on this GPU");
        return None;
    }
    Some((g, r))
}

/// The bulk gemv's short ring (16 stages) with tight shared memory, or the long one (32) with
/// the usual reservation.
fn use_short_ring(g: &mut Gpu, short: bool) {
    g.gemv_bulk_tight = short;
    g.gemv_bulk_stages = match short {
        true => kernels::GEMV_BULK_SHORT_STAGES,
        false => kernels::GEMV_BULK_STAGES,
    };
}

/// Rows shorter than a stage, m past `GEMV_MAX_M`, and x past the shared memory kept for it are
/// not the bulk kernel's; a GPU without it (before sm_90) takes no shape.
#[test]
fn gemv_bulk_grid_takes_only_its_shapes() {
    let Some((mut g, _)) = setup(58) else { return };
    // On sm_90+ every bulk kernel loaded with its shared memory (else decode silently falls
    // back to the split kernel).
    assert_eq!(g.gemv_bulk, g.compute_capability.0 >= 9);
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
    // SAFETY: the caller's buffers hold p's shapes; the outputs are m x n.
    check_outputs(g, want, what, 1e-5, |y, y32| unsafe {
        launch(g, &GemvParams { y, y32, ..p }).unwrap()
    });
}

/// `launch(y, y32)` into a poisoned bf16 output (y32 0) and then a poisoned f32 one (y 0), each
/// against `want` (bf16 within 8e-3, f32 within `f32_tol`, relative).
fn check_outputs(g: &Gpu, want: &[f32], what: &str, f32_tol: f64, launch: impl Fn(u64, u64)) {
    let n = want.len();
    let (y16, y32) = (poisoned::<bf16>(g, n), poisoned::<f32>(g, n));
    launch(y16.ptr(), 0);
    launch(0, y32.ptr());
    assert_close(&format!("{what} bf16"), &read_bf16(g, &y16, n), want, 8e-3);
    assert_close(
        &format!("{what} f32"),
        &read::<f32>(g, &y32, n),
        want,
        f32_tol,
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
