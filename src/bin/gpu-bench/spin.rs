//! A kernel that holds the GPU while the host queues a timed run, so that what the events time
//! is the GPU's work and not the host's launch rate (`overlap`, `elementwise`).

use brook::executor::cuda::compile;
use brook::executor::cuda::device::Gpu;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaFunction;
use std::time::Instant;

use crate::common::median;

/// How long the spin kernel holds the GPU (longer than any run takes to queue: the runs check
/// their queueing time against it).
pub const SPIN_NS: u64 = 20_000_000;

const SPIN_SRC: &str = r#"
// Waits `ns` nanoseconds of the GPU's global timer; returns the last reading.
__device__ unsigned long long wait_ns(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    return t;
}

// Holds one thread for `ns`.
extern "C" __global__ void spin_ns(unsigned long long ns) { wait_ns(ns); }

// The same, in a CTA that takes an SM's shared memory (the launch asks for it): a grid of n
// holds n SMs, so kernels launched beside it run on the others.
extern "C" __global__ void hog_ns(unsigned long long ns) {
    extern __shared__ unsigned char held[];
    if (wait_ns(ns) == 0) held[0] = 1;  // keep the allocation
}
"#;

/// Shared memory a hog CTA asks for: sm_90's most a block may opt into (227 KB), so no CTA of
/// another kernel that uses shared memory fits beside it.
const HOG_SMEM: u32 = 232_448;

pub struct Spin(CudaFunction, CudaFunction);

impl Spin {
    pub fn new(gpu: &Gpu) -> anyhow::Result<Spin> {
        let (maj, min) = gpu.compute_capability;
        let (ptx, _) = compile::ptx_for("bench_spin", SPIN_SRC, &compile::arch_for(maj, min))?;
        let module = gpu.ctx.load_module(ptx)?;
        let hog = module.load_function("hog_ns")?;
        hog.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            HOG_SMEM as i32,
        )?;
        Ok(Spin(module.load_function("spin_ns")?, hog))
    }

    /// Queues `ns` of holding `sms` SMs on `gpu`'s stream.
    pub fn hog(&self, gpu: &Gpu, sms: u32, ns: u64) -> anyhow::Result<()> {
        // SAFETY: hog_ns takes one u64; HOG_SMEM is within the limit set in `new`.
        unsafe { gpu.launch_fn(&self.1, "hog_ns", ((sms, 1, 1), (32, 1, 1), HOG_SMEM), &ns) }
    }

    /// Queues `SPIN_NS` of spinning on `gpu`'s stream.
    pub fn hold(&self, gpu: &Gpu) -> anyhow::Result<()> {
        self.hold_ns(gpu, SPIN_NS)
    }

    /// Queues `ns` of spinning on `gpu`'s stream.
    pub fn hold_ns(&self, gpu: &Gpu, ns: u64) -> anyhow::Result<()> {
        // SAFETY: spin_ns takes one u64.
        unsafe { gpu.launch_fn(&self.0, "spin_ns", ((1, 1, 1), (1, 1, 1), 0), &ns) }
    }

    /// Median ms of one call of `f` (call r of rep r) on an otherwise idle GPU, queued behind a
    /// short spin with its two events: the launch's own ramp and tail are in it, the host's
    /// launch latency is not (`common::time_ms` pays it on an idle GPU). Fails if the host took
    /// longer to queue than the spin held the GPU.
    pub fn time_queued_ms(
        &self,
        gpu: &Gpu,
        warmup: usize,
        reps: usize,
        mut f: impl FnMut(usize) -> anyhow::Result<()>,
    ) -> anyhow::Result<f64> {
        const HOLD_NS: u64 = 2_000_000;
        for i in 0..warmup {
            f(i)?;
        }
        let new_event = || gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        let (start, end) = (new_event()?, new_event()?);
        let mut times = Vec::with_capacity(reps);
        for r in 0..reps {
            self.hold_ns(gpu, HOLD_NS)?;
            let queued = Instant::now();
            start.record(&gpu.stream)?;
            f(warmup + r)?;
            end.record(&gpu.stream)?;
            let queue_ns = queued.elapsed().as_nanos();
            anyhow::ensure!(
                queue_ns < HOLD_NS as u128,
                "queueing one launch took {queue_ns} ns, longer than the spin"
            );
            end.synchronize()?;
            times.push(start.elapsed_ms(&end)? as f64);
        }
        Ok(median(times))
    }

    /// Whether a run that took `queue_ms` to queue outlasted the spin (the GPU then waited for
    /// the host, and the run's time includes some of the host's).
    pub fn starved(queue_ms: f64) -> bool {
        queue_ms > SPIN_NS as f64 / 1e6
    }
}
