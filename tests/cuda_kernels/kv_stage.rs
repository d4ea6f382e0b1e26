//! `kv_stage`: host-tier blocks gathered out of the paged pool into block-major staging, and
//! scattered back, against a CPU reference (random bytes, padded planes, odd block counts,
//! outputs poisoned before the run; the pool blocks a scatter does not name stay untouched).

use brook::executor::cuda::kernels::{self, KvStageParams, KV_STAGE_MAX_BLOCKS};
use rand::seq::SliceRandom;
use rand::Rng;

use crate::harness::{dev, poisoned, read, setup};

/// (planes, blocks in the pool, plane bytes, padding between planes, blocks moved).
const SHAPES: [(usize, usize, usize, usize, usize); 3] = [
    (6, 40, 16 * 37, 48, 13),
    (2, 70, 16, 0, KV_STAGE_MAX_BLOCKS),
    (64, 9, 16 * 1024, 16, 1),
];

fn params(
    pool: u64,
    staging: u64,
    shape: (usize, usize, usize, usize),
    ids: &[u32],
) -> KvStageParams {
    let (planes, num_blocks, plane_bytes, pad) = shape;
    let mut p = KvStageParams {
        pool,
        staging,
        plane_stride: (num_blocks * plane_bytes + pad) as i64,
        plane_bytes: plane_bytes as i64,
        planes: planes as i32,
        n: ids.len() as i32,
        to_staging: 1,
        blocks: [0; KV_STAGE_MAX_BLOCKS],
    };
    for (slot, &b) in p.blocks.iter_mut().zip(ids) {
        *slot = b as i32;
    }
    p
}

#[test]
fn kv_stage_gathers_and_scatters_blocks_as_the_reference() {
    let Some((g, mut r)) = setup(21) else { return };
    for (planes, num_blocks, plane_bytes, pad, n) in SHAPES {
        let stride = num_blocks * plane_bytes + pad;
        let pool_bytes = planes * stride;
        let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
        ids.shuffle(&mut r);
        ids.truncate(n);
        let shape = (planes, num_blocks, plane_bytes, pad);
        let at = |p: usize, b: usize| p * stride + b * plane_bytes;

        // Gather: staging[i][p] = pool[p][ids[i]].
        let pool: Vec<u8> = (0..pool_bytes).map(|_| r.random()).collect();
        let (pool_d, staging_d) = (dev(&g, &pool), poisoned::<u8>(&g, n * planes * plane_bytes));
        let p = params(pool_d.ptr(), staging_d.ptr(), shape, &ids);
        unsafe { kernels::kv_stage(&g, &g.stream, &p).unwrap() };
        let got: Vec<u8> = read(&g, &staging_d, n * planes * plane_bytes);
        let want: Vec<u8> = ids
            .iter()
            .flat_map(|&b| {
                (0..planes).flat_map(move |pl| at(pl, b as usize)..at(pl, b as usize) + plane_bytes)
            })
            .map(|i| pool[i])
            .collect();
        assert!(
            got == want,
            "gather {planes}x{num_blocks}x{plane_bytes}, {n} blocks"
        );

        // Scatter: pool[p][ids[i]] = staging[i][p]; every other pool byte stays poisoned.
        let staging: Vec<u8> = (0..n * planes * plane_bytes).map(|_| r.random()).collect();
        let (pool_d, staging_d) = (poisoned::<u8>(&g, pool_bytes), dev(&g, &staging));
        let mut p = params(pool_d.ptr(), staging_d.ptr(), shape, &ids);
        p.to_staging = 0;
        unsafe { kernels::kv_stage(&g, &g.stream, &p).unwrap() };
        let got: Vec<u8> = read(&g, &pool_d, pool_bytes);
        let mut want = vec![0xffu8; pool_bytes];
        for (i, &b) in ids.iter().enumerate() {
            for pl in 0..planes {
                let src = (i * planes + pl) * plane_bytes;
                want[at(pl, b as usize)..at(pl, b as usize) + plane_bytes]
                    .copy_from_slice(&staging[src..src + plane_bytes]);
            }
        }
        assert!(
            got == want,
            "scatter {planes}x{num_blocks}x{plane_bytes}, {n} blocks"
        );
    }
}

#[test]
fn kv_stage_refuses_what_it_cannot_move() {
    let Some((g, _)) = setup(22) else { return };
    let buf = poisoned::<u8>(&g, 4096);
    let ok = params(buf.ptr(), buf.ptr(), (2, 4, 256, 0), &[0, 1]);
    for bad in [
        KvStageParams { n: 0, ..ok },
        KvStageParams {
            n: KV_STAGE_MAX_BLOCKS as i32 + 1,
            ..ok
        },
        KvStageParams {
            plane_bytes: 250,
            ..ok
        },
        KvStageParams {
            plane_stride: 1000,
            ..ok
        },
    ] {
        assert!(
            unsafe { kernels::kv_stage(&g, &g.stream, &bad) }.is_err(),
            "{bad:?}"
        );
    }
}
