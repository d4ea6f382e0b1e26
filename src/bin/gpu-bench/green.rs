//! Green contexts (CUDA 12.4+ drivers): the GPU's SMs cut in two partitions, each with its own
//! streams, so that work queued on one partition never takes the other's SMs (`overlap
//! --green`). A hog kernel (`Spin::hog`) showed what part of the GPU each kind of work needs;
//! this is the mechanism a serving engine could use for it.

use anyhow::ensure;
use brook::executor::cuda::device::Gpu;
use cudarc::driver::sys;

/// Partition 0 of at least `sms` SMs (rounded as the driver requires) and partition 1 with the
/// others; destroyed when dropped (after every handle made on it).
pub struct GreenSplit {
    ctxs: [sys::CUgreenCtx; 2],
    /// SMs of each partition.
    pub sms: [u32; 2],
}

fn ok(r: sys::CUresult, what: &str) -> anyhow::Result<()> {
    ensure!(r == sys::CUresult::CUDA_SUCCESS, "{what}: {r:?}");
    Ok(())
}

impl GreenSplit {
    pub fn new(gpu: &Gpu, sms: u32) -> anyhow::Result<GreenSplit> {
        // SAFETY: every out-parameter is a local of the type the call writes; the device is
        // this GPU's.
        unsafe {
            let dev = gpu.ctx.cu_device();
            let mut all: sys::CUdevResource = std::mem::zeroed();
            let sm = sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
            ok(
                sys::cuDeviceGetDevResource(dev, &mut all, sm),
                "cuDeviceGetDevResource",
            )?;
            let (mut part, mut rest): (sys::CUdevResource, sys::CUdevResource) =
                (std::mem::zeroed(), std::mem::zeroed());
            let mut groups = 1u32;
            ok(
                sys::cuDevSmResourceSplitByCount(&mut part, &mut groups, &all, &mut rest, 0, sms),
                "cuDevSmResourceSplitByCount",
            )?;
            ensure!(groups == 1, "{sms} SMs: no partition");
            let mut ctxs = [std::ptr::null_mut(); 2];
            for (ctx, res) in ctxs.iter_mut().zip([&mut part, &mut rest]) {
                let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
                ok(
                    sys::cuDevResourceGenerateDesc(&mut desc, res, 1),
                    "cuDevResourceGenerateDesc",
                )?;
                let flags = sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32;
                ok(
                    sys::cuGreenCtxCreate(ctx, desc, dev, flags),
                    "cuGreenCtxCreate",
                )?;
            }
            let sms = [
                part.__bindgen_anon_1.sm.smCount,
                rest.__bindgen_anon_1.sm.smCount,
            ];
            // Back to the primary context for what follows (allocations, module loads).
            gpu.ctx.bind_to_thread()?;
            Ok(GreenSplit { ctxs, sms })
        }
    }

    /// A handle (its own stream and cuBLAS handle) whose work runs on partition `i`.
    pub fn gpu(&self, gpu: &Gpu, i: usize) -> anyhow::Result<Gpu> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the green context is live (self); the stream outlives every use of the
        // handle, which the caller drops before self. The borrowed wrapper never destroys the
        // stream: it is left to the process's end (gpu-bench makes four a split).
        let stream = unsafe {
            ok(
                sys::cuGreenCtxStreamCreate(&mut s, self.ctxs[i], flags, 0),
                "cuGreenCtxStreamCreate",
            )?;
            gpu.ctx.wrap_borrowed_stream(s)
        };
        gpu.sibling_on(stream)
    }
}

impl Drop for GreenSplit {
    fn drop(&mut self) {
        for &c in &self.ctxs {
            // SAFETY: created in `new`, destroyed once.
            unsafe { sys::cuGreenCtxDestroy(c) };
        }
    }
}
