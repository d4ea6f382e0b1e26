//! `block_table_update` against its CPU reference: random distinct indices into a poisoned
//! table (0xab bytes), random block ids and `NULL_BLOCK` (entries freed behind a sliding
//! window); every entry must match, updated or untouched.

use brook::executor::cuda::device::Gpu;
use brook::executor::cuda::kernels::{block_table_update, BlockTableUpdateParams};
use brook::step::NULL_BLOCK;
use rand::seq::SliceRandom;

use super::*;

#[test]
fn block_table_update_scatters_exactly_the_updates() {
    if !have_gpu() {
        return;
    }
    let g = Gpu::open(0).unwrap();
    let mut r = ChaCha8Rng::seed_from_u64(9);
    let (rows, width) = (65, 37);
    let n = rows * width;
    for num_updates in [1, 5, 300, n] {
        let mut index: Vec<u32> = (0..n as u32).collect();
        index.shuffle(&mut r);
        index.truncate(num_updates);
        let value: Vec<u32> = (0..num_updates)
            .map(|_| match r.random_bool(0.1) {
                true => NULL_BLOCK,
                false => r.random_range(0..50_000),
            })
            .collect();
        let table = g.alloc(n * 4).unwrap();
        g.memset(table.ptr(), 0xab, n * 4).unwrap();
        let (ib, vb) = (
            g.alloc(num_updates * 4).unwrap(),
            g.alloc(num_updates * 4).unwrap(),
        );
        g.upload(ib.ptr(), &index).unwrap();
        g.upload(vb.ptr(), &value).unwrap();
        let p = BlockTableUpdateParams {
            table: table.ptr(),
            index: ib.ptr(),
            value: vb.ptr(),
            num_updates: num_updates as i32,
        };
        // SAFETY: the table holds n entries, every index is below n, both lists hold
        // num_updates entries.
        unsafe { block_table_update(&g, &p).unwrap() };
        let mut got = vec![0u32; n];
        g.download(&mut got, table.ptr()).unwrap();
        let mut want = vec![0xabab_abab_u32; n];
        for (&i, &v) in index.iter().zip(&value) {
            want[i as usize] = v;
        }
        assert_eq!(got, want, "{num_updates} updates");
    }
}
