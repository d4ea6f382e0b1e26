//! `gpu-bench elementwise`: a step's element-wise kernels alone — `add_rmsnorm` and `silu_mul`
//! at the token counts of a large decode step and of a prefill — against the copy bandwidth;
//! and the gate|up GEMM over random input against the same GEMM over zeros. `--breakdown`'s
//! leave-one-out rows leave the next GEMM's input unwritten, and a GEMM over constant input
//! draws less power and may run at higher clocks: the second figure says how much of a
//! "without norms" row that can be.
//!
//! Each figure is the median over `reps` rounds of a run of back-to-back launches (buffers
//! rotated through sets larger than L2 together), queued behind a spin kernel.

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::gemm::{self, Weight};
use brook::executor::cuda::kernels::{self, AddRmsNormParams, SiluMulParams};
use brook::model::synthetic::synthetic_config;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;
use serde_json::json;

use crate::common::{elapsed_ms, emit, median, open_gpu, random_bf16};
use crate::spin::Spin;

pub struct Args<'a> {
    pub model: &'a str,
    /// Rows (tokens) of each run.
    pub tokens: &'a [usize],
    pub reps: usize,
}

/// Buffer sets the element-wise runs rotate through (4 × a batch-512 norm's 25 MB is past L2).
const SETS: usize = 4;
/// Launches of one element-wise run.
const LAUNCHES: usize = 32;
/// Launches of one GEMM run (long enough for the clocks to settle under the GEMM's power draw).
const GEMM_LAUNCHES: usize = 40;
/// The copy bandwidth the element-wise kernels are measured against (device facts, GB/s).
const COPY_GB_S: f64 = 4300.0;

/// Timing events and the spin kernel.
struct Clock {
    spin: Spin,
    start: CudaEvent,
    end: CudaEvent,
}

impl Clock {
    /// µs a launch of `launch(i)` for i in 0..n, queued behind the spin; warns when the host
    /// took longer to queue than the spin held the GPU.
    fn per_launch(
        &self,
        gpu: &Gpu,
        n: usize,
        mut launch: impl FnMut(usize) -> anyhow::Result<()>,
    ) -> anyhow::Result<f64> {
        self.spin.hold(gpu)?;
        let queued = std::time::Instant::now();
        self.start.record(&gpu.stream)?;
        for i in 0..n {
            launch(i)?;
        }
        self.end.record(&gpu.stream)?;
        let queue_ms = elapsed_ms(queued);
        if Spin::starved(queue_ms) {
            eprintln!("elementwise: queueing took {queue_ms:.1} ms, longer than the spin");
        }
        self.end.synchronize()?;
        Ok(self.start.elapsed_ms(&self.end)? as f64 * 1e3 / n as f64)
    }
}

/// `floats` fp32 of random values: `random_bf16` of twice the elements, so each float's upper
/// half is a random bf16 in [-1, 1) (its value, to bf16 precision).
fn random_f32(gpu: &Gpu, floats: usize, seed: u64) -> anyhow::Result<DevBuf> {
    random_bf16(gpu, 2 * floats, seed)
}

/// The buffers of one token count.
struct Rows {
    residual: Vec<DevBuf>,
    delta: Vec<DevBuf>,
    normed: Vec<DevBuf>,
    gate_up: Vec<DevBuf>,
    act: Vec<DevBuf>,
    x_random: DevBuf,
    x_zero: DevBuf,
    y: DevBuf,
}

impl Rows {
    fn new(gpu: &Gpu, t: usize, d: usize, inter: usize) -> anyhow::Result<Rows> {
        let sets = |f: &dyn Fn(u64) -> anyhow::Result<DevBuf>| -> anyhow::Result<Vec<DevBuf>> {
            (0..SETS as u64).map(f).collect()
        };
        let x_zero = gpu.alloc(t * d * 2)?;
        gpu.memset(x_zero.ptr(), 0, t * d * 2)?;
        Ok(Rows {
            residual: sets(&|s| random_f32(gpu, t * d, 10 + s))?,
            delta: sets(&|s| random_bf16(gpu, t * d, 20 + s))?,
            normed: sets(&|_| gpu.alloc(t * d * 2))?,
            gate_up: sets(&|s| random_f32(gpu, t * 2 * inter, 30 + s))?,
            act: sets(&|_| gpu.alloc(t * inter * 2))?,
            x_random: random_bf16(gpu, t * d, 40)?,
            x_zero,
            y: gpu.alloc(t * 2 * inter * 4)?,
        })
    }
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.reps >= 1, "elementwise needs at least one rep");
    let cfg = synthetic_config(a.model)?;
    let (d, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let gpu = open_gpu()?;
    let event = || gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let clock = Clock {
        spin: Spin::new(&gpu)?,
        start: event()?,
        end: event()?,
    };
    let norm_weight = random_bf16(&gpu, d, 1)?;
    let w_gate_up = random_bf16(&gpu, 2 * inter * d, 2)?;
    for &t in a.tokens {
        anyhow::ensure!(t >= 1, "elementwise: token counts start at 1");
        let rows = Rows::new(&gpu, t, d, inter)?;
        gpu.sync()?;
        let norm = |s: usize| {
            let p = AddRmsNormParams {
                residual: rows.residual[s % SETS].ptr(),
                delta: rows.delta[s % SETS].ptr(),
                weight: norm_weight.ptr(),
                rows: 0,
                out: rows.normed[s % SETS].ptr(),
                num_rows: t as i32,
                d: d as i32,
                eps: cfg.rms_norm_eps as f32,
            };
            // SAFETY: residual [t, d] f32, delta and out [t, d] bf16, weight [d] (Rows::new).
            unsafe { kernels::add_rmsnorm(&gpu, &p) }
        };
        // fp32 gate|up in, or bf16 (`CudaBackendOptions::gate_up_bf16`: the first half of the
        // same random buffer, random bf16 values).
        let silu = |s: usize, bf16_in: bool| {
            let p = SiluMulParams {
                gate_up: rows.gate_up[s % SETS].ptr(),
                out: rows.act[s % SETS].ptr(),
                num_tokens: t as i32,
                inter: inter as i32,
            };
            // SAFETY: gate_up [t, 2 * inter] f32 (or bf16 in its first half), out [t, inter]
            // bf16 (Rows::new).
            unsafe { kernels::silu_mul(&gpu, &p, bf16_in) }
        };
        // y in fp32, or bf16 when `bf16_out` (`CudaBackendOptions::gate_up_bf16`).
        let gate_up = |x: u64, bf16_out: bool| {
            // SAFETY: x [t, d] bf16, w [2 * inter, d] bf16, y [t, 2 * inter] f32 (Rows::new;
            // bf16 takes half of it).
            unsafe {
                gemm::linear(
                    &gpu,
                    None,
                    x,
                    Weight::bf16(w_gate_up.ptr()),
                    rows.y.ptr(),
                    t,
                    2 * inter,
                    d,
                    !bf16_out,
                )
            }
        };
        let (mut norm_us, mut silu_us, mut silu16_us) = (vec![], vec![], vec![]);
        let (mut random_us, mut zero_us, mut random16_us) = (vec![], vec![], vec![]);
        for _ in 0..a.reps {
            norm_us.push(clock.per_launch(&gpu, LAUNCHES, norm)?);
            silu_us.push(clock.per_launch(&gpu, LAUNCHES, |s| silu(s, false))?);
            silu16_us.push(clock.per_launch(&gpu, LAUNCHES, |s| silu(s, true))?);
            let (random, zero) = (rows.x_random.ptr(), rows.x_zero.ptr());
            random_us.push(clock.per_launch(&gpu, GEMM_LAUNCHES, |_| gate_up(random, false))?);
            zero_us.push(clock.per_launch(&gpu, GEMM_LAUNCHES, |_| gate_up(zero, false))?);
            random16_us.push(clock.per_launch(&gpu, GEMM_LAUNCHES, |_| gate_up(random, true))?);
        }
        // Bytes each launch moves: the residual read and written (f32), delta read and the
        // normed rows written (bf16); gate|up read (f32 or bf16) and the product written (bf16).
        for (kernel, us, bytes) in [
            ("add_rmsnorm", median(norm_us), t * d * (4 + 4 + 2 + 2)),
            ("silu_mul", median(silu_us), t * inter * (2 * 4 + 2)),
            ("silu_mul_bf16", median(silu16_us), t * inter * (2 * 2 + 2)),
        ] {
            let gb_s = bytes as f64 / us / 1e3;
            eprintln!(
                "elementwise {} {kernel} over {t} tokens: {us:.1} us, {gb_s:.0} GB/s ({:.0} % of copy)",
                a.model,
                100.0 * gb_s / COPY_GB_S
            );
            emit(
                json!({"figure": "elementwise", "model": a.model, "kernel": kernel, "tokens": t, "us": us, "gb_s": gb_s, "copy_share": gb_s / COPY_GB_S}),
            );
        }
        let flops = 2.0 * t as f64 * (2 * inter) as f64 * d as f64;
        let (random, zero, random16) = (median(random_us), median(zero_us), median(random16_us));
        eprintln!(
            "elementwise {} gate|up GEMM over {t} tokens: random input {random:.1} us ({:.0} TFLOP/s), zeros {zero:.1} us ({:.0} TFLOP/s): zeros take {:.3}x the time; bf16 out {random16:.1} us ({:.0} TFLOP/s)",
            a.model,
            flops / random / 1e6,
            flops / zero / 1e6,
            zero / random,
            flops / random16 / 1e6
        );
        emit(
            json!({"figure": "gemm_input", "model": a.model, "gemm": "gate_up", "tokens": t, "random_us": random, "zero_us": zero, "random_tflops": flops / random / 1e6, "zero_tflops": flops / zero / 1e6, "zero_over_random": zero / random, "bf16_out_us": random16}),
        );
    }
    Ok(())
}
