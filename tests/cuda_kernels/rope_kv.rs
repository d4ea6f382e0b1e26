//! `rope_kv`: RoPE on Q and K from the fp32 QKV rows, K and V written to the paged cache.

use brook::executor::cuda::kernels::{self, RopeKvParams};
use brook::model::config::RopeScaling;

use crate::harness::{dev, gpu, inv_freqs, rand_f32, rng};
use crate::paged::KvLayout;
use crate::qkv_write::{QkvDev, QkvWrite};

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
        let scaling = match llama3 {
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
            head_dim,
        };
        let inv = inv_freqs(500000.0, scaling, head_dim);
        let mut write = QkvWrite::random(&mut r, (t, 5000, num_blocks), heads, layout, inv);
        write.slots[3] = u32::MAX; // padding token: no cache write
        let (qb, d) = (dev(&g, &qkv), QkvDev::new(&g, &write, num_blocks));
        let p = RopeKvParams {
            qkv: qb.ptr(),
            positions: d.positions.ptr(),
            slots: d.slots.ptr(),
            inv_freq: d.inv_freq.ptr(),
            q_out: d.q_out.ptr(),
            k_cache: d.k_cache.ptr(),
            v_cache: d.v_cache.ptr(),
            num_tokens: t as i32,
            num_heads: heads as i32,
            num_kv_heads: kv_heads as i32,
            head_dim: head_dim as i32,
            block_size: bs as i32,
        };
        unsafe { kernels::rope_kv(&g, &p).unwrap() };
        // V is stored as its input rounded to bf16, bit for bit.
        d.check(&g, "rope", &write, &qkv, true);
    }
}
