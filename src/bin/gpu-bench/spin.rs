//! A kernel that holds the GPU while the host queues a timed run, so that what the events time
//! is the GPU's work and not the host's launch rate (`overlap`, `elementwise`).

use brook::executor::cuda::compile;
use brook::executor::cuda::device::Gpu;
use cudarc::driver::CudaFunction;

/// How long the spin kernel holds the GPU (longer than any run takes to queue: the runs check
/// their queueing time against it).
pub const SPIN_NS: u64 = 20_000_000;

const SPIN_SRC: &str = r#"
// Holds one thread for `ns` nanoseconds of the GPU's global timer.
extern "C" __global__ void spin_ns(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"#;

pub struct Spin(CudaFunction);

impl Spin {
    pub fn new(gpu: &Gpu) -> anyhow::Result<Spin> {
        let (maj, min) = gpu.compute_capability;
        let (ptx, _) = compile::ptx_for("bench_spin", SPIN_SRC, &compile::arch_for(maj, min))?;
        Ok(Spin(gpu.ctx.load_module(ptx)?.load_function("spin_ns")?))
    }

    /// Queues `SPIN_NS` of spinning on `gpu`'s stream.
    pub fn hold(&self, gpu: &Gpu) -> anyhow::Result<()> {
        // SAFETY: spin_ns takes one u64.
        unsafe { gpu.launch_fn(&self.0, "spin_ns", ((1, 1, 1), (1, 1, 1), 0), &SPIN_NS) }
    }

    /// Whether a run that took `queue_ms` to queue outlasted the spin (the GPU then waited for
    /// the host, and the run's time includes some of the host's).
    pub fn starved(queue_ms: f64) -> bool {
        queue_ms > SPIN_NS as f64 / 1e6
    }
}
