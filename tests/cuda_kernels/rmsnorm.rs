//! `add_rmsnorm`: residual += delta, then RMSNorm of all rows or of chosen rows.

use brook::executor::cuda::kernels::{self, AddRmsNormParams};
use half::bf16;

use crate::harness::{
    assert_close, dev, poisoned, rand_bf16, rand_f32, read, read_bf16, setup, to_f32,
};

fn rmsnorm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, w)| (*v as f64 * inv * *w as f64) as f32)
        .collect()
}

#[test]
fn add_rmsnorm_updates_residual_and_normalises() {
    let Some((g, mut r)) = setup(2) else { return };
    // Every chunk count up to the largest hidden size; 1000 leaves threads without a chunk.
    for (t, d) in [(23usize, 1000usize), (3, 8192), (2, 384)] {
        let eps = 1e-5f32;
        let residual = rand_f32(&mut r, t * d, 2.0);
        let delta = rand_bf16(&mut r, t * d, 1.0);
        let weight = rand_bf16(&mut r, d, 1.5);
        let (res, de, w) = (dev(&g, &residual), dev(&g, &delta), dev(&g, &weight));
        // All rows, with the residual add.
        let out = poisoned::<bf16>(&g, t * d);
        let p = AddRmsNormParams {
            residual: res.ptr(),
            delta: de.ptr(),
            weight: w.ptr(),
            rows: 0,
            out: out.ptr(),
            num_rows: t as i32,
            d: d as i32,
            eps,
        };
        unsafe { kernels::add_rmsnorm(&g, &p).unwrap() };
        let new_res: Vec<f32> = read(&g, &res, t * d);
        let want_res: Vec<f32> = residual
            .iter()
            .zip(&delta)
            .map(|(a, b)| a + b.to_f32())
            .collect();
        assert_eq!(new_res, want_res);
        let wf = to_f32(&weight);
        let want: Vec<f32> = (0..t)
            .flat_map(|i| rmsnorm_ref(&want_res[i * d..(i + 1) * d], &wf, eps))
            .collect();
        assert_close("add_rmsnorm", &read_bf16(&g, &out, t * d), &want, 8e-3);
        // A subset of rows (the final norm at sampled positions), no add.
        let rows: Vec<i32> = vec![t as i32 - 1, 0, t as i32 / 2];
        let (rb, out2) = (dev(&g, &rows), poisoned::<bf16>(&g, rows.len() * d));
        let p2 = AddRmsNormParams {
            delta: 0,
            rows: rb.ptr(),
            out: out2.ptr(),
            num_rows: rows.len() as i32,
            ..p
        };
        unsafe { kernels::add_rmsnorm(&g, &p2).unwrap() };
        let want2: Vec<f32> = rows
            .iter()
            .flat_map(|&i| rmsnorm_ref(&want_res[i as usize * d..(i as usize + 1) * d], &wf, eps))
            .collect();
        assert_close(
            "rmsnorm rows",
            &read_bf16(&g, &out2, rows.len() * d),
            &want2,
            8e-3,
        );
        assert_eq!(
            read::<f32>(&g, &res, t * d),
            want_res,
            "no delta: residual unchanged"
        );
    }
}
