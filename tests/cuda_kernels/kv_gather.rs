//! `kv_gather`: a sequence's K and V copied out of the paged cache into contiguous per-query-head
//! scratch for the GEMM prefill path.

use brook::executor::cuda::kernels::{self, KvGatherParams};
use half::bf16;

use crate::harness::{dev, kv_gpu, poisoned, read, rng};
use crate::paged::{KvLayout, Paged};

#[test]
fn kv_gather_copies_contexts_per_query_head() {
    gather(false);
}

/// From an e4m3 cache: the same rows widened to bf16, exactly (every e4m3 value is a bf16).
#[test]
fn kv_gather_widens_an_e4m3_cache() {
    gather(true);
}

fn gather(fp8: bool) {
    let Some(g) = kv_gpu(fp8) else { return };
    for (seed, head_dim, heads, kv_heads) in [
        (80u64, 128usize, 4usize, 4usize),
        (81, 64, 6, 2),
        (82, 16, 8, 2),
    ] {
        let mut r = rng(seed);
        let bs = 16;
        let ctx = [45usize, 1, 300, 17, 64];
        let layout = KvLayout {
            kv_heads,
            block_size: bs,
            head_dim,
        };
        let paged = Paged::random_kv(&mut r, &ctx, 3, layout, fp8);
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
        let (entries_b, key0_b) = (dev(&g, &entries_i), dev(&g, &key0));
        let dp = paged.upload(&g);
        let p = KvGatherParams {
            k_cache: dp.k_cache.ptr(),
            v_cache: dp.v_cache.ptr(),
            gemm_seq: entries_b.ptr(),
            gemm_key0: key0_b.ptr(),
            context_lens: dp.context_lens.ptr(),
            block_tables: dp.block_tables.ptr(),
            k_out: k_out.ptr(),
            v_out: v_out.ptr(),
            num_gemm: entries.len() as i32,
            num_heads: heads as i32,
            num_kv_heads: kv_heads as i32,
            head_dim: head_dim as i32,
            block_size: bs as i32,
            max_blocks: paged.max_blocks as i32,
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
                    let slot = paged.slot(s, j);
                    let o = base + (h * ctx[s] + j) * head_dim;
                    let bits = |x: &[bf16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        &kg[o..o + head_dim],
                        &bits(paged.cache.k_row(slot, h / group))[..],
                        "k fp8 {fp8}: entry {e} (seq {s}) head {h} key {j}"
                    );
                    assert_eq!(
                        &vg[o..o + head_dim],
                        &bits(paged.cache.v_row(slot, h / group))[..],
                        "v fp8 {fp8}: entry {e} (seq {s}) head {h} key {j}"
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
