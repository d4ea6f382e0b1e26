//! `Gpu::start_trace` / `take_trace` (gpu-bench's `--trace`): one entry per launch while on,
//! kernels by name and cuBLAS GEMMs by shape, each with a time; nothing once taken.

use brook::executor::cuda::gemm::{self, Weight};
use brook::executor::cuda::kernels::{self, SiluMulParams};
use half::bf16;

use crate::harness::{dev, poisoned, rand_bf16, rand_f32, setup};

#[test]
fn trace_names_and_times_each_launch() {
    let Some((g, mut r)) = setup(61) else { return };
    let (t, inter, n, k) = (64, 1024, 512, 256);
    let gu = dev(&g, &rand_f32(&mut r, t * 2 * inter, 2.0));
    let act = poisoned::<bf16>(&g, t * inter);
    let (x, w) = (
        dev(&g, &rand_bf16(&mut r, 200 * k, 1.0)),
        dev(&g, &rand_bf16(&mut r, n * k, 1.0)),
    );
    let y = poisoned::<bf16>(&g, 200 * n);
    let p = SiluMulParams {
        gate_up: gu.ptr(),
        out: act.ptr(),
        num_tokens: t as i32,
        inter: inter as i32,
    };
    let gemm = || unsafe {
        gemm::linear(
            &g,
            None,
            x.ptr(),
            Weight::bf16(w.ptr()),
            y.ptr(),
            200,
            n,
            k,
            false,
        )
    };
    g.start_trace().unwrap();
    unsafe { kernels::silu_mul(&g, &p, false).unwrap() };
    gemm().unwrap();
    unsafe { kernels::silu_mul(&g, &p, false).unwrap() };
    let trace = g.take_trace().unwrap();
    let names: Vec<&str> = trace.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["silu_mul", "gemm 200x512x256", "silu_mul"]);
    for (name, ms) in &trace {
        assert!(*ms > 0.0 && *ms < 1e3, "{name}: {ms} ms");
    }
    // Off once taken: later launches are not recorded, and a second take is empty.
    unsafe { kernels::silu_mul(&g, &p, false).unwrap() };
    assert!(g.take_trace().unwrap().is_empty());
}
