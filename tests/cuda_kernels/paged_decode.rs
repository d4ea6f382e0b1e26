//! `paged_decode`: one query row per sequence over its paged context, split-k or not.

use brook::executor::cuda::kernels::{self, decode_splits, PagedDecodeParams};
use half::bf16;
use rand::seq::SliceRandom;

use crate::harness::{assert_close, dev, poisoned, rand_bf16, read_bf16, setup, to_f32};
use crate::paged::{KvLayout, Paged};

fn check_paged_decode(
    seed: u64,
    head_dim: usize,
    heads: usize,
    kv_heads: usize,
    ctx: &[usize],
    splits: Option<usize>,
) {
    let Some((g, mut r)) = setup(seed) else {
        return;
    };
    let bs = 16;
    let layout = KvLayout {
        kv_heads,
        block_size: bs,
        head_dim,
    };
    let paged = Paged::random(&mut r, ctx, 7, layout);
    // Items in a shuffled order, on token rows with gaps, as in a mixed batch.
    let n = ctx.len();
    let mut item_seq: Vec<i32> = (0..n as i32).collect();
    item_seq.shuffle(&mut r);
    let item_row: Vec<i32> = (0..n as i32).map(|i| 2 * i + 1).collect();
    let rows = 2 * n + 1;
    let q = rand_bf16(&mut r, rows * heads * head_dim, 1.0);
    let num_splits =
        splits.unwrap_or_else(|| decode_splits(g.num_sms, n, kv_heads, *ctx.iter().max().unwrap()));
    let (qb, rows_b, seqs_b) = (dev(&g, &q), dev(&g, &item_row), dev(&g, &item_seq));
    let dp = paged.upload(&g);
    let out = poisoned::<bf16>(&g, rows * heads * head_dim);
    let part_acc = poisoned::<f32>(&g, n * heads * num_splits * head_dim);
    let part_ml = poisoned::<f32>(&g, n * heads * num_splits * 2);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let p = PagedDecodeParams {
        q: qb.ptr(),
        k_cache: dp.k_cache.ptr(),
        v_cache: dp.v_cache.ptr(),
        item_row: rows_b.ptr(),
        item_seq: seqs_b.ptr(),
        block_tables: dp.block_tables.ptr(),
        context_lens: dp.context_lens.ptr(),
        out: out.ptr(),
        part_acc: part_acc.ptr(),
        part_ml: part_ml.ptr(),
        num_items: n as i32,
        num_heads: heads as i32,
        num_kv_heads: kv_heads as i32,
        block_size: bs as i32,
        max_blocks: paged.max_blocks as i32,
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
            let want = paged.attend_ref(&qf[o..o + head_dim], s, h / group, ctx[s], scale as f64);
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
