//! The gemv chain (gemv_chain.cu): a decode layer's four linear ops in one cooperative launch,
//! each op reading what the one before it wrote in the same launch (the grid barrier), against
//! a CPU reference of the same chain, for every row count, on the small-model build (512-byte
//! stages) and the Llama-sized one (4096-byte stages, rows ending inside a warp's step).

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::kernels::{self, ChainOp, ChainX, GemvChainParams, GEMV_MAX_M};
use half::bf16;
use rand_chacha::ChaCha8Rng;

use crate::harness::{
    assert_close, dev, matmul_ref, poisoned, rand_bf16, rand_f32, read, read_bf16, setup, to_f32,
};

/// Shapes of the chain: k0 (hidden), n0 (QKV rows), k1 (the o projection's k), k3 (the
/// intermediate size); the o and down projections have k0 rows, gate|up 2 k3.
struct Shapes {
    k0: usize,
    n0: usize,
    k1: usize,
    k3: usize,
}

#[test]
fn gemv_chain_matches_reference() {
    let Some((mut g, mut r)) = setup(71) else {
        return;
    };
    for (s, stage) in [
        (
            Shapes {
                k0: 256,
                n0: 776,
                k1: 512,
                k3: 520,
            },
            512,
        ),
        (
            Shapes {
                k0: 2048,
                n0: 3000,
                k1: 2048,
                k3: 2056,
            },
            4096,
        ),
    ] {
        let shapes = [(s.n0, s.k0), (s.k0, s.k1), (2 * s.k3, s.k0), (s.k0, s.k3)];
        let sb = kernels::chain_stage_bytes(&g, 1, &shapes);
        if !g.gemv_bulk {
            assert_eq!(sb, None, "no chain without the bulk ring (before sm_90)");
            return;
        }
        assert_eq!(sb, Some(stage));
        g.load_gemv_chain(stage).unwrap();
        for m in 1..=GEMV_MAX_M {
            check_chain(&g, &mut r, &s, m, stage);
        }
    }
}

fn rmsnorm_ref(v: &[f32], gamma: &[f32], k: usize, eps: f32) -> Vec<f32> {
    v.chunks(k)
        .flat_map(|row| {
            let ms = row.iter().map(|x| x * x).sum::<f32>() / k as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter()
                .zip(gamma)
                .map(move |(x, g)| bf16::from_f32(x * inv * g).to_f32())
        })
        .collect()
}

fn silu_ref(gu: &[f32], k: usize) -> Vec<f32> {
    gu.chunks(2 * k)
        .flat_map(|row| {
            (0..k).map(move |i| {
                let (gt, up) = (row[i], row[k + i]);
                bf16::from_f32(gt / (1.0 + (-gt).exp()) * up).to_f32()
            })
        })
        .collect()
}

fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// One layer's chain at `m` rows on the build with `stage`-byte stages, launched twice (the
/// barrier is left ready by the first).
fn check_chain(g: &Gpu, r: &mut ChaCha8Rng, s: &Shapes, m: usize, stage: usize) {
    let eps = 1e-5f32;
    let (k0, n0, k1, k3) = (s.k0, s.n0, s.k1, s.k3);
    let w: Vec<Vec<bf16>> = [(n0, k0), (k0, k1), (2 * k3, k0), (k0, k3)]
        .iter()
        .map(|&(n, k)| rand_bf16(r, n * k, 0.05))
        .collect();
    let res = rand_f32(r, m * k0, 2.0);
    let delta0 = rand_bf16(r, m * k0, 1.0);
    let attn = rand_bf16(r, m * k1, 1.0);
    let gamma0 = rand_bf16(r, k0, 1.5);
    let gamma2 = rand_bf16(r, k0, 1.5);
    // The reference, op by op; each bf16 output rounded as the kernel stores it.
    let wf: Vec<Vec<f32>> = w.iter().map(|x| to_f32(x)).collect();
    let v0 = add(&res, &to_f32(&delta0));
    let x0 = rmsnorm_ref(&v0, &to_f32(&gamma0), k0, eps);
    let qkv = matmul_ref(&x0, &wf[0], m, n0, k0);
    let d1 = round_bf16(&matmul_ref(&to_f32(&attn), &wf[1], m, k0, k1));
    let v2 = add(&v0, &d1);
    let x2 = rmsnorm_ref(&v2, &to_f32(&gamma2), k0, eps);
    let gu = round_bf16(&matmul_ref(&x2, &wf[2], m, 2 * k3, k0));
    let d3 = round_bf16(&matmul_ref(&silu_ref(&gu, k3), &wf[3], m, k0, k3));

    let wd: Vec<DevBuf> = w.iter().map(|x| dev(g, x)).collect();
    let (res_d, delta_d, attn_d) = (dev(g, &res), dev(g, &delta0), dev(g, &attn));
    let (gamma0_d, gamma2_d) = (dev(g, &gamma0), dev(g, &gamma2));
    let res_b = poisoned::<f32>(g, m * k0);
    let res_a = poisoned::<f32>(g, m * k0);
    let qkv_d = poisoned::<f32>(g, m * n0);
    let d1_d = poisoned::<u16>(g, m * k0);
    let gu_d = poisoned::<u16>(g, m * 2 * k3);
    let d3_d = poisoned::<u16>(g, m * k0);
    let ops = [
        ChainOp {
            src: res_d.ptr(),
            delta: delta_d.ptr(),
            gamma: gamma0_d.ptr(),
            res_out: res_b.ptr(),
            y: 0,
            y32: qkv_d.ptr(),
            x_mode: ChainX::Norm,
            eps,
            ..ChainOp::plain(wd[0].ptr(), 0, 0, n0, k0)
        },
        ChainOp::plain(wd[1].ptr(), attn_d.ptr(), d1_d.ptr(), k0, k1),
        ChainOp {
            src: res_b.ptr(),
            delta: d1_d.ptr(),
            gamma: gamma2_d.ptr(),
            res_out: res_a.ptr(),
            x_mode: ChainX::Norm,
            eps,
            ..ChainOp::plain(wd[2].ptr(), 0, gu_d.ptr(), 2 * k3, k0)
        },
        ChainOp {
            x_mode: ChainX::Silu,
            ..ChainOp::plain(wd[3].ptr(), gu_d.ptr(), d3_d.ptr(), k0, k3)
        },
    ];
    let ops_d = dev(g, &ops);
    let bar = dev(g, &[0u32; 2]);
    let p = GemvChainParams {
        ops: ops_d.ptr(),
        count: ops.len() as i32,
        m: m as i32,
        barrier: bar.ptr(),
    };
    for launch in 0..2 {
        // SAFETY: every op's buffers hold its [m, .] rows; the barrier is zeroed.
        unsafe { kernels::gemv_chain(g, &p, stage) }.unwrap();
        g.sync().unwrap();
        let what = format!("gemv_chain sb {stage} m {m} k0 {k0} launch {launch}");
        assert_close(
            &format!("{what}: qkv"),
            &read::<f32>(g, &qkv_d, m * n0),
            &qkv,
            1e-2,
        );
        assert_close(
            &format!("{what}: residual B"),
            &read::<f32>(g, &res_b, m * k0),
            &v0,
            1e-6,
        );
        assert_close(
            &format!("{what}: o"),
            &read_bf16(g, &d1_d, m * k0),
            &d1,
            1e-2,
        );
        assert_close(
            &format!("{what}: residual A"),
            &read::<f32>(g, &res_a, m * k0),
            &v2,
            1e-2,
        );
        assert_close(
            &format!("{what}: gate|up"),
            &read_bf16(g, &gu_d, m * 2 * k3),
            &gu,
            1e-2,
        );
        assert_close(
            &format!("{what}: down"),
            &read_bf16(g, &d3_d, m * k0),
            &d3,
            2e-2,
        );
        // Four ops, three barriers a launch: arrivals back to 0, the generation moved on.
        let passed = 3 * (launch as u32 + 1);
        let words = read::<u32>(g, &bar, 2);
        assert_eq!(words, [0, passed], "{what}: barrier [arrivals, generation]");
    }
}
