//! The RoPE + paged K/V write shared by `rope_kv` and `gemv_qkv_rope`: where each token goes,
//! the poisoned outputs, and the checker of what was written (and that nothing else was).

use brook::executor::cuda::device::{DevBuf, Gpu};
use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::harness::{assert_close, dev, poisoned, read_bf16, rope_ref};
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
    /// `v_exact`, else lie within the rotation's tolerance.
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
                written[o..o + head_dim].iter_mut().for_each(|w| *w = true);
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

/// Q rows and the whole K and V caches as read back.
pub struct QkvWritten<'a> {
    pub q: &'a [f32],
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
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
}

impl QkvDev {
    pub fn new(g: &Gpu, write: &QkvWrite, num_blocks: usize) -> Self {
        let l = write.layout;
        let q_elems = write.positions.len() * write.heads * l.head_dim;
        let cache_elems = num_blocks * l.kv_heads * l.block_size * l.head_dim;
        QkvDev {
            positions: dev(g, &write.positions),
            slots: dev(g, &write.slots),
            inv_freq: dev(g, &write.inv_freq),
            q_out: poisoned::<bf16>(g, q_elems),
            k_cache: poisoned::<bf16>(g, cache_elems),
            v_cache: poisoned::<bf16>(g, cache_elems),
            q_elems,
            cache_elems,
        }
    }

    /// Reads the outputs back and checks them against `write` of `qkv` (`QkvWrite::check`).
    pub fn check(&self, g: &Gpu, what: &str, write: &QkvWrite, qkv: &[f32], v_exact: bool) {
        let got = QkvWritten {
            q: &read_bf16(g, &self.q_out, self.q_elems),
            k_cache: &read_bf16(g, &self.k_cache, self.cache_elems),
            v_cache: &read_bf16(g, &self.v_cache, self.cache_elems),
        };
        write.check(what, qkv, got, v_exact);
    }
}
