//! The shared checkers themselves, on the CPU (these run without a GPU): each accepts an output
//! computed the way the kernel should compute it and rejects a NaN (what `poisoned` leaves) or a
//! wrong value, so a GPU run cannot pass through a checker that looks at nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};

use brook::model::config::RopeScaling;
use half::bf16;

use crate::harness::{
    assert_close, assert_max_abs, e4m3, e4m3_to_f32, inv_freqs, rand_f32, rng, rope_ref,
    through_e4m3,
};
use crate::paged::{KvLayout, PrefillBatch};
use crate::qkv_write::{assert_e4m3, QkvWrite, QkvWritten};

fn panics(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

#[test]
fn error_checks_reject_poison_and_error() {
    let want = [1.0f32, -2.0, 3.0];
    assert_close("same", &want, &want, 1e-6);
    assert_max_abs("same", &want, &want, 1e-6);
    // Every byte 0xff, as `poisoned` leaves an output: a negative NaN.
    let poison = f32::from_bits(u32::MAX);
    for bad in [[1.0f32, -2.0, poison], [1.0, -2.0, 3.1]] {
        assert!(panics(|| assert_close("bad", &bad, &want, 1e-2)), "{bad:?}");
        assert!(
            panics(|| assert_max_abs("bad", &bad, &want, 1e-2)),
            "{bad:?}"
        );
    }
}

#[test]
fn qkv_write_check_accepts_the_reference_and_rejects_stray_writes() {
    let mut r = rng(7);
    let heads = 4;
    let layout = KvLayout {
        kv_heads: 2,
        block_size: 4,
        head_dim: 8,
    };
    let (kvh, bs, hd) = (layout.kv_heads, layout.block_size, layout.head_dim);
    let width = (heads + 2 * kvh) * hd;
    let positions = [3u32, 103, 203, 303, 4000];
    let slots = [7u32, 0, u32::MAX, 11, 4];
    let qkv = rand_f32(&mut r, positions.len() * width, 2.0);
    let inv = inv_freqs(10000.0, RopeScaling::None, hd);
    // What the kernel leaves: Q and K rotated, K and V at their slots, all rounded to bf16.
    let round = |x: &[f32]| -> Vec<f32> { x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect() };
    let n_cache = 3 * kvh * bs * hd;
    let (mut q, mut k, mut v) = (Vec::new(), vec![f32::NAN; n_cache], vec![f32::NAN; n_cache]);
    for (t, (&pos, &slot)) in positions.iter().zip(&slots).enumerate() {
        let row = &qkv[t * width..(t + 1) * width];
        for h in 0..heads {
            q.extend(round(&rope_ref(&row[h * hd..(h + 1) * hd], pos, &inv)));
        }
        for kh in (0..kvh).filter(|_| slot != u32::MAX) {
            let (o, kr, vr) = (
                layout.offset(slot as usize, kh),
                (heads + kh) * hd,
                (heads + kvh + kh) * hd,
            );
            k[o..o + hd].copy_from_slice(&round(&rope_ref(&row[kr..kr + hd], pos, &inv)));
            v[o..o + hd].copy_from_slice(&round(&row[vr..vr + hd]));
        }
    }
    let write = QkvWrite {
        heads,
        layout,
        inv_freq: inv.clone(),
        positions: positions.to_vec(),
        slots: slots.to_vec(),
    };
    let check = |k: &[f32], v: &[f32], v_exact: bool| {
        let got = QkvWritten {
            q: &q,
            k_cache: k,
            v_cache: v,
            fp8: false,
            fp8_slack: 0.0,
        };
        write.check("cpu", &qkv, got, v_exact);
    };
    check(&k, &v, true);
    check(&k, &v, false);
    // Slot 1 belongs to no token: a write there is caught, in K or in V.
    let mut stray = k.clone();
    stray[layout.offset(1, 1)] = 0.5;
    assert!(panics(|| check(&stray, &v, false)));
    assert!(panics(|| check(&k, &stray, false)));
    // V off by one bf16 step passes the tolerance but not the exact check.
    let o = layout.offset(7, 0);
    let mut nudged = v.clone();
    nudged[o] = bf16::from_bits(bf16::from_f32(nudged[o]).to_bits() + 1).to_f32();
    check(&k, &nudged, false);
    assert!(panics(|| check(&k, &nudged, true)));
}

#[test]
fn prefill_rows_check_covers_every_query_and_head() {
    let b = PrefillBatch::random(&mut rng(8), 16, 4, 2, &[(3, 5), (1, 1), (4, 20)]);
    let want = b.reference();
    assert_eq!(want.len(), b.tokens() * b.row_elems());
    assert_eq!(b.rows_of(&want, &[0, 1, 2]), want);
    let label = |s: usize| format!("seq {s}");
    b.assert_rows(&want, &want, 1e-6, label);
    let mut bad = want.clone();
    *bad.last_mut().unwrap() = f32::NAN;
    assert!(panics(|| b.assert_rows(&bad, &want, 1e-2, label)));
    // Sequence 1 has a single key: each head's output is that key's V row.
    let (hd, bs) = (b.layout().head_dim, b.layout().block_size);
    let slot = b.paged.bt[b.paged.max_blocks] as usize * bs;
    assert_eq!(b.paged.slot(1, 0), slot);
    for h in 0..b.heads {
        let o = (b.q_start[1] * b.heads + h) * hd;
        let v = b.paged.cache.v_row(slot, h / b.group());
        let v: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
        assert_close(&format!("one key, head {h}"), &want[o..o + hd], &v, 1e-6);
    }
}

#[test]
fn window_reference_ignores_keys_before_the_window_and_freed_blocks() {
    let mut r = rng(9);
    let (seqs, window) = ([(40usize, 100usize), (7, 7)], 30);
    let full = PrefillBatch::random(&mut r, 16, 4, 2, &seqs);
    let mut windowed = PrefillBatch::random(&mut rng(9), 16, 4, 2, &seqs);
    // Sequence 0's first query (position 60) sees 31..=60: blocks 0 (0..16) is freed, block 1
    // (16..32) holds key 31 and stays.
    assert_eq!(windowed.with_window(window), 1);
    assert_eq!(windowed.paged.bt[0], -1);
    let (a, b) = (full.reference(), windowed.reference());
    let e = full.row_elems();
    // Sequence 1 (7 keys, inside the window) is unchanged; sequence 0's rows differ.
    assert_eq!(full.rows_of(&a, &[1]), windowed.rows_of(&b, &[1]));
    assert_ne!(a[..e], b[..e]);
    // The last row of sequence 0 (position 99) sees 70..=99: the same as a window over a cache
    // whose earlier keys were never written.
    let q: Vec<f32> = full.q[39 * e..39 * e + 16]
        .iter()
        .map(|x| x.to_f32())
        .collect();
    let want = full.paged.attend_window_ref(&q, 0, 0, 100, 30, 0.25);
    assert_eq!(&b[39 * e..39 * e + 16], &want[..]);
    assert_ne!(want, full.paged.attend_window_ref(&q, 0, 0, 100, 0, 0.25));
}

/// The CPU reference quantizer (float8's e4m3) on values whose bytes are known: round to nearest
/// even, subnormals down to 2^-9, saturation at ±448 (never NaN for a finite input), as the
/// kernels' `cvt.rn.satfinite.e4m3x2.f32`.
#[test]
fn e4m3_quantizer_rounds_to_nearest_even_and_saturates() {
    for (x, bits) in [
        (0.0f32, 0x00u8),
        (-0.0, 0x80),
        (1.0, 0x38),
        (-1.0, 0xb8),
        (1.125, 0x39),
        (1.0625, 0x38), // halfway between 1 and 1.125: to even (1)
        (1.1875, 0x3a), // halfway between 1.125 and 1.25: to even (1.25)
        (1.06, 0x38),
        (1.07, 0x39),
        (1.1, 0x39),
        (0.0625, 0x18), // 2^-4
        (240.0, 0x77),
        (448.0, 0x7e), // the largest finite
        (449.0, 0x7e),
        (500.0, 0x7e), // saturates (no inf in e4m3; 0x7f is NaN)
        (1e9, 0x7e),
        (-1e9, 0xfe),
        (f32::INFINITY, 0x7e),
        (0.015625, 0x08),     // 2^-6, the smallest normal
        (0.001953125, 0x01),  // 2^-9, the smallest subnormal
        (0.0009765625, 0x00), // 2^-10: halfway to 2^-9, to even (0)
        (0.0029296875, 0x02), // 1.5 * 2^-9: halfway, to even (2 * 2^-9)
        (0.0048828125, 0x02), // 2.5 * 2^-9: halfway, to even (2 * 2^-9)
    ] {
        assert_eq!(e4m3(x), bits, "{x}");
    }
    assert!(e4m3_to_f32(e4m3(f32::NAN)).is_nan());
    assert!(e4m3_to_f32(0xff).is_nan(), "poison reads as NaN");
    // Every finite byte reads back to a value that quantizes to itself.
    for b in (0u8..=0xff).filter(|b| b & 0x7f != 0x7f) {
        let x = e4m3_to_f32(b);
        assert_eq!(e4m3(x), b, "{b:#04x} -> {x}");
        assert_eq!(
            bf16::from_f32(x).to_f32(),
            x,
            "{b:#04x}: e4m3 is exact in bf16"
        );
    }
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
    assert_eq!(through_e4m3(0.3), 0.3125);
}

#[test]
fn e4m3_check_accepts_the_quantized_reference_and_rejects_a_step() {
    let want = [0.3f32, -1.7, 90.0, 1e-5, -3.0e-3];
    let got: Vec<f32> = want.iter().map(|&x| through_e4m3(x)).collect();
    assert_e4m3("exact", &got, &want, 0.0);
    assert_e4m3("slack", &got, &want, 1e-3);
    for i in 0..want.len() {
        // One e4m3 step off, or NaN (an unwritten byte): rejected even with slack.
        let mut bad = got.clone();
        let b = e4m3(bad[i]);
        bad[i] = e4m3_to_f32(if b & 0x7f == 0x7e { b - 1 } else { b + 1 });
        assert!(panics(|| assert_e4m3("step", &bad, &want, 1e-3)), "{i}");
        bad[i] = f32::NAN;
        assert!(panics(|| assert_e4m3("nan", &bad, &want, 1e-3)), "{i}");
    }
    // At a rounding boundary (1.0625, between 1 and 1.125) slack accepts either neighbour.
    assert_e4m3("tie", &[1.125], &[1.0625], 1e-3);
    assert!(panics(|| assert_e4m3(
        "tie exact",
        &[1.125],
        &[1.0625],
        0.0
    )));
}
