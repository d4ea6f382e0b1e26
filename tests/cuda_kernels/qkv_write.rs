//! The RoPE + paged K/V write shared by `rope_kv` and `gemv_qkv_rope`: where each token goes,
//! the poisoned outputs, and the checker of what was written (and that nothing else was), into
//! a bf16 or an e4m3 cache.

use brook::executor::cuda::device::{DevBuf, Gpu};
use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::harness::{
    assert_close, dev, e4m3, poisoned, read_bf16, read_e4m3, rope_ref, through_e4m3,
};
use crate::paged::KvLayout;

/// Where a Q/K/V write puts each token: its position (for RoPE) and its cache slot
/// (`u32::MAX`: a padding token, not written).
pub struct QkvWrite {
    pub heads: usize,
    pub layout: KvLayout,
    pub inv_freq: Vec<f32>,
    pub positions: Vec<u32>,
    pub slots: Vec<u32>,
}

impl QkvWrite {
    /// `tokens` at random positions below `max_pos`, in distinct random slots of `num_blocks`.
    pub fn random(
        r: &mut ChaCha8Rng,
        (tokens, max_pos, num_blocks): (usize, u32, usize),
        heads: usize,
        layout: KvLayout,
        inv_freq: Vec<f32>,
    ) -> QkvWrite {
        let positions: Vec<u32> = (0..tokens).map(|_| r.random_range(0..max_pos)).collect();
        let mut slots: Vec<u32> = (0..(num_blocks * layout.block_size) as u32).collect();
        slots.shuffle(r);
        slots.truncate(tokens);
        QkvWrite {
            heads,
            layout,
            inv_freq,
            positions,
            slots,
        }
    }

    /// Checks what was written from the rows `qkv` ([tokens, (heads + 2 kv_heads) head_dim],
    /// f32): Q rotated at each position, K rotated and V stored at each token's slot, nothing
    /// written elsewhere in the cache (still NaN). V must equal its bf16 rounding exactly when
    /// `v_exact`, else lie within the rotation's tolerance. An e4m3 cache (`got.fp8`): K and V
    /// are the CPU quantizer's bytes of the reference (`assert_e4m3`), V exactly when `v_exact`,
    /// else (and K always) up to `got.fp8_slack`.
    pub fn check(&self, what: &str, qkv: &[f32], got: QkvWritten, v_exact: bool) {
        let (heads, layout) = (self.heads, self.layout);
        let (kv_heads, head_dim) = (layout.kv_heads, layout.head_dim);
        let width = (heads + 2 * kv_heads) * head_dim;
        let rot = |x: &[f32], pos: u32| rope_ref(x, pos, &self.inv_freq);
        let mut written = vec![false; got.k_cache.len()];
        for (t, (&pos, &slot)) in self.positions.iter().zip(&self.slots).enumerate() {
            let row = &qkv[t * width..(t + 1) * width];
            for h in 0..heads {
                let o = (t * heads + h) * head_dim;
                assert_close(
                    &format!("{what} q token {t} head {h}"),
                    &got.q[o..o + head_dim],
                    &rot(&row[h * head_dim..(h + 1) * head_dim], pos),
                    8e-3,
                );
            }
            if slot == u32::MAX {
                continue;
            }
            for kh in 0..kv_heads {
                let o = layout.offset(slot as usize, kh);
                let kr = (heads + kh) * head_dim;
                let vr = (heads + kv_heads + kh) * head_dim;
                written[o..o + head_dim].iter_mut().for_each(|w| *w = true);
                if got.fp8 {
                    let slack = got.fp8_slack;
                    assert_e4m3(
                        &format!("{what} k token {t} kv head {kh}"),
                        &got.k_cache[o..o + head_dim],
                        &rot(&row[kr..kr + head_dim], pos),
                        slack,
                    );
                    assert_e4m3(
                        &format!("{what} v token {t} kv head {kh}"),
                        &got.v_cache[o..o + head_dim],
                        &row[vr..vr + head_dim],
                        if v_exact { 0.0 } else { slack },
                    );
                    continue;
                }
                assert_close(
                    &format!("{what} k token {t} kv head {kh}"),
                    &got.k_cache[o..o + head_dim],
                    &rot(&row[kr..kr + head_dim], pos),
                    8e-3,
                );
                let (v_got, v_in) = (&got.v_cache[o..o + head_dim], &row[vr..vr + head_dim]);
                if v_exact {
                    let v_bf16: Vec<f32> =
                        v_in.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
                    assert_eq!(v_got, &v_bf16[..], "{what} v token {t} kv head {kh}");
                } else {
                    assert_close(
                        &format!("{what} v token {t} kv head {kh}"),
                        v_got,
                        v_in,
                        8e-3,
                    );
                }
            }
        }
        assert!(
            got.k_cache
                .iter()
                .chain(got.v_cache)
                .zip(written.iter().chain(&written))
                .all(|(x, w)| *w || x.is_nan()),
            "{what}: K/V written outside the slot mapping"
        );
    }
}

/// `got`, read back from an e4m3 cache, is the CPU quantizer's e4m3 of `want`, element by
/// element; where the kernel's fp32 arithmetic (sincosf, fp32 sums) may land on the other side
/// of a rounding boundary from the f64 reference, the byte of `want ± slack·(|want| + 1e-3)` is
/// accepted too (`slack` 0: exact).
pub fn assert_e4m3(what: &str, got: &[f32], want: &[f32], slack: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = slack * (w.abs() + 1e-3);
        let ok = [w, w - d, w + d]
            .iter()
            .any(|&x| through_e4m3(x).to_bits() == g.to_bits());
        assert!(
            ok,
            "{what}: element {i} is {g} (e4m3 {:#04x}), the reference {w} quantizes to {} (slack {slack:.0e})",
            e4m3(g),
            through_e4m3(w)
        );
    }
}

/// Q rows and the whole K and V caches as read back (K and V as f32 of their bf16 or e4m3).
pub struct QkvWritten<'a> {
    pub q: &'a [f32],
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    /// The cache is e4m3.
    pub fp8: bool,
    /// The relative slack of `assert_e4m3` for K (and V unless exact).
    pub fp8_slack: f32,
}

/// A Q/K/V write on the device: its inputs uploaded, its outputs poisoned before the run.
pub struct QkvDev {
    pub positions: DevBuf,
    pub slots: DevBuf,
    pub inv_freq: DevBuf,
    pub q_out: DevBuf,
    pub k_cache: DevBuf,
    pub v_cache: DevBuf,
    q_elems: usize,
    cache_elems: usize,
    /// The cache is e4m3 (one byte an element; 0xff poison is NaN there too).
    fp8: bool,
}

impl QkvDev {
    /// Poisoned outputs for `write` over a cache of `num_blocks` (e4m3 when `fp8`).
    pub fn new(g: &Gpu, write: &QkvWrite, num_blocks: usize, fp8: bool) -> Self {
        let l = write.layout;
        let q_elems = write.positions.len() * write.heads * l.head_dim;
        let cache_elems = num_blocks * l.kv_heads * l.block_size * l.head_dim;
        let cache = || match fp8 {
            false => poisoned::<bf16>(g, cache_elems),
            true => poisoned::<u8>(g, cache_elems),
        };
        QkvDev {
            positions: dev(g, &write.positions),
            slots: dev(g, &write.slots),
            inv_freq: dev(g, &write.inv_freq),
            q_out: poisoned::<bf16>(g, q_elems),
            k_cache: cache(),
            v_cache: cache(),
            q_elems,
            cache_elems,
            fp8,
        }
    }

    /// Reads the outputs back and checks them against `write` of `qkv` (`QkvWrite::check`;
    /// `fp8_slack` for an e4m3 cache, `assert_e4m3`).
    pub fn check(
        &self,
        g: &Gpu,
        what: &str,
        write: &QkvWrite,
        qkv: &[f32],
        v_exact: bool,
        fp8_slack: f32,
    ) {
        let read_cache = |b: &DevBuf| match self.fp8 {
            false => read_bf16(g, b, self.cache_elems),
            true => read_e4m3(g, b, self.cache_elems),
        };
        let got = QkvWritten {
            q: &read_bf16(g, &self.q_out, self.q_elems),
            k_cache: &read_cache(&self.k_cache),
            v_cache: &read_cache(&self.v_cache),
            fp8: self.fp8,
            fp8_slack,
        };
        write.check(what, qkv, got, v_exact);
    }
}
