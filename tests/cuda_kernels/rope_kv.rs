//! `rope_kv`: RoPE on Q and K from the fp32 QKV rows, K and V written to the paged cache; with
//! the per-family extras first (q/k/v bias, RMSNorm of each q and k head, longrope's scale);
//! into a bf16 or an e4m3 cache.

use brook::executor::cuda::kernels::{self, RopeKvParams};
use brook::model::config::RopeScaling;
use half::bf16;
use rand_chacha::ChaCha8Rng;

use crate::harness::{dev, inv_freqs, kv_gpu, rand_bf16, rand_f32, rng, to_f32};
use crate::paged::KvLayout;
use crate::qkv_write::{QkvDev, QkvWrite};

/// One rope_kv launch; each test overrides the knobs it is about.
#[derive(Clone)]
struct Rope {
    seed: u64,
    head_dim: usize,
    heads: usize,
    kv_heads: usize,
    llama3: bool,
    bias: bool,
    qk_norm: bool,
    rope_scale: f32,
    /// Write an e4m3 cache (the `-DKV_FP8` kernel), checked byte for byte.
    fp8: bool,
}

impl Default for Rope {
    fn default() -> Self {
        Rope {
            seed: 40,
            head_dim: 128,
            heads: 6,
            kv_heads: 2,
            llama3: false,
            bias: false,
            qk_norm: false,
            rope_scale: 1.0,
            fp8: false,
        }
    }
}

const EPS: f32 = 1e-6;

impl Rope {
    /// What the kernel should rotate: the rows with bias added, q and k heads normalised and
    /// scaled by `rope_scale` (RoPE is linear, so scaling before it equals scaling cos and sin);
    /// V rows with their bias.
    fn transformed(&self, qkv: &[f32], bias: &[f32], qn: &[f32], kn: &[f32], t: usize) -> Vec<f32> {
        let hd = self.head_dim;
        let width = (self.heads + 2 * self.kv_heads) * hd;
        let mut out = qkv.to_vec();
        for row in out.chunks_mut(width).take(t) {
            for (h, head) in row.chunks_mut(hd).enumerate() {
                if self.bias {
                    head.iter_mut()
                        .zip(&bias[h * hd..])
                        .for_each(|(x, b)| *x += b);
                }
                if h >= self.heads + self.kv_heads {
                    continue; // v: bias only
                }
                if self.qk_norm {
                    let ms = head.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / hd as f64;
                    let inv = 1.0 / (ms + EPS as f64).sqrt();
                    let w = if h < self.heads { qn } else { kn };
                    head.iter_mut()
                        .zip(w)
                        .for_each(|(x, w)| *x = (*x as f64 * inv * *w as f64) as f32);
                }
                head.iter_mut().for_each(|x| *x *= self.rope_scale);
            }
        }
        out
    }

    fn run(&self) {
        let Some(g) = kv_gpu(self.fp8) else { return };
        let mut r: ChaCha8Rng = rng(self.seed);
        let (hd, heads, kv_heads) = (self.head_dim, self.heads, self.kv_heads);
        let (t, bs, num_blocks) = (29, 16, 40);
        let width = (heads + 2 * kv_heads) * hd;
        let qkv = rand_f32(&mut r, t * width, 2.0);
        let scaling = match self.llama3 {
            true => RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 256,
            },
            false => RopeScaling::None,
        };
        let layout = KvLayout {
            kv_heads,
            block_size: bs,
            head_dim: hd,
        };
        let inv = inv_freqs(500000.0, scaling, hd);
        let mut write = QkvWrite::random(&mut r, (t, 5000, num_blocks), heads, layout, inv);
        write.slots[3] = u32::MAX; // padding token: no cache write
        let bias = rand_bf16(&mut r, width, 0.5);
        // Norm weights around 1, distinct for q and k.
        let qn: Vec<bf16> = rand_f32(&mut r, hd, 0.3)
            .iter()
            .map(|x| bf16::from_f32(1.0 + x))
            .collect();
        let kn: Vec<bf16> = rand_f32(&mut r, hd, 0.3)
            .iter()
            .map(|x| bf16::from_f32(1.0 - x))
            .collect();
        let (bias_b, qn_b, kn_b) = (dev(&g, &bias), dev(&g, &qn), dev(&g, &kn));
        let (qb, d) = (dev(&g, &qkv), QkvDev::new(&g, &write, num_blocks, self.fp8));
        let p = RopeKvParams {
            qkv: qb.ptr(),
            positions: d.positions.ptr(),
            slots: d.slots.ptr(),
            inv_freq: d.inv_freq.ptr(),
            qkv_bias: if self.bias { bias_b.ptr() } else { 0 },
            q_norm: if self.qk_norm { qn_b.ptr() } else { 0 },
            k_norm: if self.qk_norm { kn_b.ptr() } else { 0 },
            q_out: d.q_out.ptr(),
            k_cache: d.k_cache.ptr(),
            v_cache: d.v_cache.ptr(),
            num_tokens: t as i32,
            num_heads: heads as i32,
            num_kv_heads: kv_heads as i32,
            head_dim: hd as i32,
            block_size: bs as i32,
            eps: EPS,
            rope_scale: self.rope_scale,
        };
        unsafe { kernels::rope_kv(&g, &p).unwrap() };
        let plain = !self.bias && !self.qk_norm && self.rope_scale == 1.0;
        let want = self.transformed(&qkv, &to_f32(&bias), &to_f32(&qn), &to_f32(&kn), t);
        // V is stored as its input (plus bias) rounded to bf16; bit for bit without a bias.
        let what = format!(
            "rope hd{hd} bias {} qk_norm {} scale {} fp8 {}",
            self.bias, self.qk_norm, self.rope_scale, self.fp8
        );
        // e4m3: V's bytes exactly the CPU quantizer's when plain; K's (and V's otherwise) too,
        // but for a reference within 0.1 % of a rounding boundary (the kernel's fp32 angle at
        // positions up to 5000 is off by ~1e-4 rad from the f64 one).
        d.check(&g, &what, &write, &want, plain, 1e-3);
    }
}

#[test]
fn rope_kv_rotates_and_writes_the_cache() {
    Rope::default().run();
    Rope {
        seed: 41,
        head_dim: 64,
        heads: 4,
        kv_heads: 4,
        llama3: true,
        ..Rope::default()
    }
    .run();
}

#[test]
fn rope_kv_every_head_dim() {
    // 80 and 96 take 64 threads of which 40 / 48 hold a pair; 256 takes 128.
    for (i, head_dim) in [80, 96, 256].into_iter().enumerate() {
        Rope {
            seed: 42 + i as u64,
            head_dim,
            ..Rope::default()
        }
        .run();
    }
}

#[test]
fn rope_kv_adds_the_qkv_bias() {
    Rope {
        seed: 45,
        bias: true,
        ..Rope::default()
    }
    .run();
}

#[test]
fn rope_kv_normalises_q_and_k_heads() {
    for (i, head_dim) in [128, 80].into_iter().enumerate() {
        Rope {
            seed: 46 + i as u64,
            head_dim,
            qk_norm: true,
            ..Rope::default()
        }
        .run();
    }
}

#[test]
fn rope_kv_bias_norm_and_longrope_scale_together() {
    Rope {
        seed: 48,
        head_dim: 96,
        heads: 7,
        kv_heads: 1,
        bias: true,
        qk_norm: true,
        rope_scale: 1.19,
        ..Rope::default()
    }
    .run();
}

/// An e4m3 cache: K and V bytes against the CPU quantizer, at every head size, with the
/// per-family extras, and nothing written outside the slot mapping (poison stays NaN).
#[test]
fn rope_kv_writes_an_e4m3_cache() {
    for (i, head_dim) in [16, 64, 80, 96, 128, 256].into_iter().enumerate() {
        Rope {
            seed: 60 + i as u64,
            head_dim,
            fp8: true,
            ..Rope::default()
        }
        .run();
    }
    Rope {
        seed: 66,
        head_dim: 96,
        heads: 7,
        kv_heads: 1,
        bias: true,
        qk_norm: true,
        rope_scale: 1.19,
        llama3: true,
        fp8: true,
    }
    .run();
}
