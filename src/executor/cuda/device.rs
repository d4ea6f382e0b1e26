//! The GPU handle: context, one stream, cuBLAS, the compiled kernels, and raw device buffers.
//!
//! Everything runs on one stream (but the KV tier's block copies, on a stream of their own that
//! explicit events order: `kv_tier`), so cudarc's per-buffer event tracking is switched off: it
//! would add an event record/wait per launch and get in the way of CUDA-graph capture. Kernels
//! take one `#[repr(C)]` parameter struct by value (raw device pointers inside), mirrored in
//! `kernels/*.cu`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use cudarc::cublas::{sys as cublas_sys, CudaBlas};
use cudarc::driver::{
    result, sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr,
};
use cudarc::nvrtc::Ptx;

use super::compile;
use super::options::GemvSmem;

/// A device allocation addressed by raw pointer; freed on drop.
pub struct DevBuf {
    _slice: CudaSlice<u8>,
    ptr: u64,
    bytes: usize,
}

impl DevBuf {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Pointer to element `index` of a buffer of `T`s.
    pub fn at<T>(&self, index: usize) -> u64 {
        debug_assert!((index + 1) * std::mem::size_of::<T>() <= self.bytes);
        self.ptr + (index * std::mem::size_of::<T>()) as u64
    }
}

/// Whether a CUDA driver and at least one GPU can be used, without risking a panic: cudarc's
/// dynamic loader panics when libcuda is missing, so the library is looked for first and the
/// first driver call runs under `catch_unwind`.
pub fn probe() -> Result<(), String> {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    if !unsafe { sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) was not found".into());
    }
    match std::panic::catch_unwind(CudaContext::device_count) {
        Ok(Ok(n)) if n > 0 => Ok(()),
        Ok(Ok(_)) => Err("the CUDA driver reports no GPU".into()),
        Ok(Err(e)) => Err(format!("the CUDA driver failed to start: {e}")),
        Err(_) => Err("loading the CUDA driver panicked".into()),
    }
}

/// GPUs the driver reports; 0 where `probe` fails.
pub fn device_count() -> usize {
    match probe() {
        Ok(()) => CudaContext::device_count().map_or(0, |n| n.max(0) as usize),
        Err(_) => 0,
    }
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub num_sms: u32,
    /// Linear layers with at most this many rows use the `gemv` kernel instead of cuBLAS
    /// (0: always cuBLAS).
    pub gemv_max_m: usize,
    /// Warps per row of every gemv launch (1, 2, 4 or 8); 0: chosen per shape
    /// (`kernels::gemv_split`). Benchmarks set it to compare.
    pub gemv_split: usize,
    /// Decode GEMVs on the bulk-copy kernel (`kernels::gemv_bulk_grid`, kernels/gemv_bulk.cu)
    /// where it takes the shape; on by default on sm_90+, where it is built.
    pub gemv_bulk: bool,
    /// The bulk gemv's deep-ring kernels (`gemv_bulk_deep_m*`) were given their shared memory
    /// (`GemvSmem::Deep` launches fall back to tight where not).
    pub gemv_deep: bool,
    /// The shared memory each bulk gemv launch asks for (`options::GemvSmem`). Roomy on a
    /// fresh handle; the backend sets its options' (`CudaBackendOptions::gemv_smem`).
    pub gemv_smem: GemvSmem,
    /// Extra `-D` defines for the decode attention builds (`load_attention`): tuning overrides
    /// that kernels/paged_decode_mma.cu documents (`DMMA_*`), for benchmarks to compare. Empty
    /// on a fresh handle; the backend sets its options' (`CudaBackendOptions::decode_defines`).
    pub decode_defines: Vec<(String, usize)>,
    /// Launch the kernels that support it with programmatic dependent launch (sm_90+): their
    /// start overlaps the previous kernel's tail (`pdl_wait` in kernels/common.cuh).
    pub pdl: bool,
    /// Also launch these of `rope_kv`, `silu_mul` and `sample` with PDL (when `pdl`; bits of
    /// `options::pdl_small`): each waits for the projection before it (`pdl_wait`) instead of
    /// starting only once that kernel has ended. None on a fresh handle; the backend sets its
    /// options' (`CudaBackendOptions::pdl_small`).
    pub pdl_small: u32,
    /// Prefill attention on the wgmma kernel where `load_attention` built it (sm_90, head dim
    /// 64 or 128; `kernels::prefill_attn`); false: the mma.sync kernel everywhere.
    /// Tests and benchmarks set it to compare.
    pub prefill_wgmma: bool,
    /// K/V tiles of the wgmma prefill kernel over a bf16 cache (`compile::PREFILL_WG_STAGES`
    /// by default): 2 also builds `prefill_attn_wg_hd{H}_st2` (its pipelined loop) in
    /// `load_attention`, and `kernels::prefill_attn_kernel` picks it. Set before
    /// `load_attention`; e4m3 caches take the 1-stage kernel.
    pub prefill_wg_stages: usize,
    /// Also build the wgmma prefill kernel's TMA loads (`prefill_attn_wg_hd{H}_tma_st{S}`,
    /// `kernels::prefill_tma_kernel`; bf16 caches) in `load_attention`; the forward pass then
    /// gives it tensor maps of its cache. Set before `load_attention`.
    pub prefill_tma: bool,
    /// The KV cache is e4m3 (`set_kv_fp8`): the kernels that read or write it are the
    /// `-DKV_FP8=1` builds, loaded under their names + `_fp8` (`kv_kernel`).
    kv_fp8: bool,
    /// The loaded kernels by name (one lookup a launch finds both the function and its shared
    /// memory).
    functions: HashMap<String, Kernel>,
    _blas_workspace: DevBuf,
    /// Per-launch timing (`start_trace`, gpu-bench's `--trace`): while Some, every launch on the
    /// compute stream records an event after it, under the kernel's name. `tracing` says so
    /// without the lock, which a launch outside a trace never takes.
    trace: Mutex<Option<Vec<(String, CudaEvent)>>>,
    tracing: AtomicBool,
}

/// cuBLAS needs its own workspace for graph capture (it must not allocate while capturing).
const CUBLAS_WORKSPACE_BYTES: usize = 64 << 20;

impl Gpu {
    pub fn open(ordinal: usize) -> anyhow::Result<Gpu> {
        probe().map_err(|e| anyhow::anyhow!("no usable CUDA device: {e}"))?;
        let ctx = CudaContext::new(ordinal).context("creating the CUDA context")?;
        // SAFETY: set before any buffer exists; all work goes through one stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let name = ctx.name()?;
        let compute_capability = ctx.compute_capability()?;
        let num_sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        let (blas, ws) = blas_on(&stream)?;
        let functions = load_kernels(&ctx, compute_capability)?;
        let mut gpu = Gpu {
            ctx,
            stream,
            blas,
            name,
            compute_capability,
            num_sms,
            gemv_max_m: compile::GEMV_MAX_M,
            gemv_split: 0,
            gemv_bulk: false,
            gemv_deep: false,
            gemv_smem: GemvSmem::Roomy,
            decode_defines: Vec::new(),
            pdl: compute_capability.0 >= 9,
            pdl_small: 0,
            prefill_wgmma: true,
            prefill_wg_stages: compile::PREFILL_WG_STAGES,
            prefill_tma: false,
            kv_fp8: false,
            functions,
            _blas_workspace: ws,
            trace: Mutex::default(),
            tracing: AtomicBool::new(false),
        };
        // The bulk gemv's ring and x take ~208 KB of shared memory a CTA: where the GPU cannot
        // give that (e.g. sm_120's ~100 KB), decode stays on the split gemv.
        if compute_capability.0 >= 9 {
            gpu.gemv_bulk = compile::gemv_bulk_kernels()
                .all(|name| gpu.set_dyn_smem(&name, compile::GEMV_BULK_SMEM).is_ok());
            gpu.gemv_deep = gpu.gemv_bulk
                && compile::gemv_bulk_deep_kernels().all(|name| {
                    gpu.set_dyn_smem(&name, compile::GEMV_BULK_DEEP_SMEM)
                        .is_ok()
                });
        }
        Ok(gpu)
    }

    /// A second handle on this GPU's context for work that should run beside this handle's:
    /// its own stream (at `priority`, where lower numbers run first; None: the default) and
    /// cuBLAS handle, the kernels loaded so far and the same switches. Buffers are shared (one
    /// context); nothing orders the two streams but the events a caller records.
    pub fn sibling(&self, priority: Option<i32>) -> anyhow::Result<Gpu> {
        let stream = match priority {
            Some(p) => self.ctx.new_stream_with_priority(p)?,
            None => self.ctx.new_stream()?,
        };
        self.sibling_on(stream)
    }

    /// `sibling` on a stream made elsewhere (gpu-bench: a green context's, which runs its work
    /// on part of the SMs).
    pub fn sibling_on(&self, stream: Arc<CudaStream>) -> anyhow::Result<Gpu> {
        let (blas, ws) = blas_on(&stream)?;
        Ok(Gpu {
            ctx: self.ctx.clone(),
            stream,
            blas,
            name: self.name.clone(),
            functions: self.functions.clone(),
            decode_defines: self.decode_defines.clone(),
            _blas_workspace: ws,
            trace: Mutex::default(),
            tracing: AtomicBool::new(false),
            ..*self
        })
    }

    pub fn function(&self, name: &str) -> &CudaFunction {
        &self.kernel(name).f
    }

    fn kernel(&self, name: &str) -> &Kernel {
        self.functions
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not in kernels/*.cu"))
    }

    /// Dynamic shared memory every launch of the loaded kernel `name` takes (`set_dyn_smem`).
    pub fn dyn_smem(&self, name: &str) -> u32 {
        self.kernel(name).smem
    }

    /// Warp steps the tensor-core decode kernel keeps in flight in shared memory: `DMMA_RING`
    /// of `decode_defines`, else the kernel's default for this cache (`compile::decode_ring`).
    fn decode_ring(&self) -> usize {
        self.decode_defines
            .iter()
            .find(|(n, _)| n == "DMMA_RING")
            .map_or(compile::decode_ring(self.kv_fp8), |(_, v)| *v)
    }

    pub fn has_function(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    /// Switches the KV cache kernels to e4m3 (`--kv-cache-dtype fp8`) or back to bf16: the first
    /// switch to e4m3 compiles (or takes from the PTX cache) the `-DKV_FP8=1` builds of the files
    /// that write or gather the cache (`compile::KV_SOURCES`), loaded as `{kernel}_fp8`; then
    /// `load_attention` builds its kernels likewise. Needs sm_89+ (the e4m3 conversions are
    /// instructions there). A `Forward` sets it once, before its pool exists (a pool holds one
    /// dtype); tests and benchmarks switch back and forth on one context to compare.
    pub fn set_kv_fp8(&mut self, on: bool) -> anyhow::Result<()> {
        if !on || self.kv_fp8 {
            self.kv_fp8 = on;
            return Ok(());
        }
        let (major, minor) = self.compute_capability;
        anyhow::ensure!(
            (major, minor) >= (8, 9),
            "--kv-cache-dtype fp8 needs compute capability 8.9 or newer (e4m3 conversions); this GPU ({}) has {major}.{minor}: use --kv-cache-dtype auto",
            self.name
        );
        let arch = compile::arch_for(major, minor);
        for &file in compile::KV_SOURCES {
            let loaded = kernel_names(file.1)
                .first()
                .is_some_and(|f| self.functions.contains_key(&format!("{f}_fp8")));
            if !loaded {
                // (else loaded by an earlier switch)
                self.build(file, &arch, &[("KV_FP8", 1)], "_fp8")?;
            }
        }
        self.kv_fp8 = true;
        Ok(())
    }

    /// Fails unless this GPU has the e4m3 conversions and fp8 tensor cores (sm_89+) that `what`
    /// needs.
    pub fn check_fp8(&self, what: &str) -> anyhow::Result<()> {
        let (major, minor) = self.compute_capability;
        anyhow::ensure!(
            (major, minor) >= (8, 9),
            "{what} needs compute capability 8.9 or newer (e4m3); this GPU ({}) has {major}.{minor}",
            self.name
        );
        Ok(())
    }

    /// Whether the KV cache is e4m3 (`set_kv_fp8`).
    pub fn kv_fp8(&self) -> bool {
        self.kv_fp8
    }

    /// The loaded name of kernel `name`, one that reads or writes the KV cache: `name`, or
    /// `name_fp8` for an e4m3 cache.
    pub fn kv_kernel(&self, name: &str) -> String {
        match self.kv_fp8 {
            true => format!("{name}_fp8"),
            false => name.to_string(),
        }
    }

    /// Compiles (or takes from the PTX cache) and loads the attention kernels for one model
    /// shape: `paged_decode_hd{H}_g{G}` and `paged_decode_reduce_hd{H}_g{G}` (kernels/
    /// paged_decode.cu with `-DHD=H -DGROUP=G`) and `prefill_attn_hd{H}` (`-DHD=H`), each with
    /// `-DKV_FP8=1` and `_fp8` after its name when the cache is e4m3 (`set_kv_fp8`); on Hopper
    /// also `prefill_attn_wg_hd{H}` (likewise) where `compile::prefill_wgmma_supported`.
    /// Idempotent.
    pub fn load_attention(&mut self, head_dim: usize, group: usize) -> anyhow::Result<()> {
        anyhow::ensure!(
            compile::attention_supported(head_dim, group),
            "no attention kernels for head_dim {head_dim} (a multiple of 16 from 16 to 256) and {group} query heads per kv head"
        );
        let arch = compile::arch_for(self.compute_capability.0, self.compute_capability.1);
        let (fp8, tail) = match self.kv_fp8 {
            true => (vec![("KV_FP8", 1)], "_fp8"),
            false => (vec![], ""),
        };
        // On Hopper the prefill file comes with its wgmma kernel, for sm_90a.
        let wgmma = compile::prefill_wgmma_supported(self.compute_capability, head_dim);
        let (prefill, prefill_arch, stages) = match wgmma {
            true => (
                compile::PREFILL_ATTN_WG,
                compile::WGMMA_ARCH.to_string(),
                vec![("WG_STAGES", 1)],
            ),
            false => (compile::PREFILL_ATTN, arch.clone(), vec![]),
        };
        let tuning = self.decode_defines.clone();
        let tuning = tuning.iter().map(|(n, v)| (n.as_str(), *v));
        let shaped = [
            (
                compile::PAGED_DECODE,
                [vec![("HD", head_dim), ("GROUP", group)], fp8.clone()]
                    .concat()
                    .into_iter()
                    .chain(tuning)
                    .collect(),
                format!("_hd{head_dim}_g{group}{tail}"),
                arch,
            ),
            (
                prefill,
                [vec![("HD", head_dim)], fp8, stages].concat(),
                format!("_hd{head_dim}{tail}"),
                prefill_arch,
            ),
        ];
        for (file, defines, suffix, arch) in shaped {
            if !self.functions.contains_key(&format!("{}{suffix}", file.0)) {
                self.build(file, &arch, &defines, &suffix)?;
            }
        }
        if self.compute_capability.0 >= 9 {
            // Decode splits merged in a cluster (`launch_pdl_cluster`) may number 16, past the
            // portable 8.
            for k in ["paged_decode", "paged_decode_mma"] {
                let name = format!("{k}_hd{head_dim}_g{group}{tail}");
                self.function(&name)
                    .set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                    )
                    .with_context(|| format!("{name}: clusters of 16"))?;
            }
        }
        let ring = self.decode_ring();
        let mma = format!("paged_decode_mma_hd{head_dim}_g{group}{tail}");
        if ring > 0 && self.has_function(&mma) && self.kernel(&mma).smem == 0 {
            self.set_dyn_smem(&mma, compile::decode_ring_smem(head_dim, self.kv_fp8, ring))?;
        }
        let wg = format!("prefill_attn_wg_hd{head_dim}{tail}");
        if wgmma && self.kernel(&wg).smem == 0 {
            let bytes = compile::prefill_wgmma_smem(head_dim, 1, self.kv_fp8);
            self.set_dyn_smem(&wg, bytes)?;
        }
        if wgmma && self.prefill_wg_stages == 2 {
            self.load_prefill_wg_variant(head_dim, 2, false)?;
        }
        if wgmma && self.prefill_tma {
            self.load_prefill_wg_variant(head_dim, self.prefill_wg_stages, true)?;
        }
        Ok(())
    }

    /// The wgmma prefill kernel at `head_dim` with `stages` K/V tiles of each kind
    /// (`-DWG_STAGES`), with TMA loads when `tma` (`-DWG_TMA`: its params need `kv_maps`),
    /// loaded as `prefill_attn_wg_hd{H}_st{S}` (`_hd{H}_tma_st{S}`); its name, or None where
    /// the kernel is not built (`compile::prefill_wgmma_supported`; these builds take bf16
    /// caches only). Idempotent.
    pub fn load_prefill_wg_variant(
        &mut self,
        head_dim: usize,
        stages: usize,
        tma: bool,
    ) -> anyhow::Result<Option<String>> {
        if !compile::prefill_wgmma_supported(self.compute_capability, head_dim) || self.kv_fp8 {
            return Ok(None);
        }
        let suffix = match tma {
            true => format!("_hd{head_dim}_tma_st{stages}"),
            false => format!("_hd{head_dim}_st{stages}"),
        };
        let name = format!("prefill_attn_wg{suffix}");
        if !self.functions.contains_key(&name) {
            let defines = [
                ("HD", head_dim),
                ("WG_STAGES", stages),
                ("WG_TMA", tma as usize),
            ];
            self.build(
                compile::PREFILL_ATTN_WG,
                compile::WGMMA_ARCH,
                &defines,
                &suffix,
            )?;
            self.set_dyn_smem(&name, compile::prefill_wgmma_smem(head_dim, stages, false))?;
        }
        Ok(Some(name))
    }

    /// The gemv chain (kernels/gemv_chain.cu; gpu-bench) built with `stage_bytes` ring stages
    /// (`kernels::chain_stage_bytes`), loaded as `kernels::chain_kernel_name(m, stage_bytes)`
    /// for m = 1..=GEMV_MAX_M, each with its shared memory. Idempotent.
    pub fn load_gemv_chain(&mut self, stage_bytes: usize) -> anyhow::Result<()> {
        use compile::{chain_kernel_name, chain_smem};
        if self
            .functions
            .contains_key(&chain_kernel_name(1, stage_bytes))
        {
            return Ok(());
        }
        let arch = compile::arch_for(self.compute_capability.0, self.compute_capability.1);
        let src = compile::gemv_chain_source();
        let defines = [("GB_STAGE_BYTES", stage_bytes)];
        let suffix = format!("_sb{stage_bytes}");
        self.build(("gemv_chain", &src), &arch, &defines, &suffix)?;
        for m in 1..=compile::GEMV_MAX_M {
            self.set_dyn_smem(&chain_kernel_name(m, stage_bytes), chain_smem(stage_bytes))?;
        }
        Ok(())
    }

    /// gpu-bench: the flash prefill kernel at `head_dim` built with `-DPF_LOADS=loads` (how K/V
    /// tiles are loaded; see prefill_attn.cu), loaded as `prefill_attn_hd{H}_loads{L}` (+ `_fp8`
    /// for an e4m3 cache); its name.
    pub fn load_prefill_variant(
        &mut self,
        head_dim: usize,
        loads: usize,
    ) -> anyhow::Result<String> {
        let name = self.kv_kernel(&format!("prefill_attn_hd{head_dim}_loads{loads}"));
        if self.functions.contains_key(&name) {
            return Ok(name);
        }
        let arch = compile::arch_for(self.compute_capability.0, self.compute_capability.1);
        let mut defines = vec![("HD", head_dim), ("PF_LOADS", loads)];
        if self.kv_fp8 {
            defines.push(("KV_FP8", 1));
        }
        // Every kernel of the file under this variant's suffix: `prefill_attn` becomes `name`.
        let suffix = name
            .strip_prefix("prefill_attn")
            .context("prefill variant name")?
            .to_string();
        self.build(compile::PREFILL_ATTN, &arch, &defines, &suffix)?;
        Ok(name)
    }

    /// Uninitialised device memory.
    pub fn alloc(&self, bytes: usize) -> anyhow::Result<DevBuf> {
        alloc_on(&self.stream, bytes)
    }

    pub fn upload<T: Copy>(&self, dst: u64, src: &[T]) -> anyhow::Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller's buffer at `dst` holds at least `src`'s bytes; pageable copies are
        // staged before the call returns, so `src` may be dropped afterwards.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }?;
        Ok(())
    }

    /// Copies device memory to `dst` and waits for the stream.
    pub fn download<T: Copy>(&self, dst: &mut [T], src: u64) -> anyhow::Result<()> {
        if !dst.is_empty() {
            // SAFETY: `src` holds at least `dst`'s bytes; the sync below completes the copy.
            unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        }
        self.stream.synchronize()?;
        Ok(())
    }

    /// Starts a copy of device memory into `dst`; it is complete after the next `sync`.
    ///
    /// # Safety
    /// `src` holds at least `dst`'s bytes, and `dst` is neither read nor moved before `sync`.
    pub unsafe fn download_async<T: Copy>(&self, dst: &mut [T], src: u64) -> anyhow::Result<()> {
        if !dst.is_empty() {
            result::memcpy_dtoh_async(dst, src, self.stream.cu_stream())?;
        }
        Ok(())
    }

    /// Copies `bytes` from `src` to `dst` on the stream (gpu-bench's copy floor).
    ///
    /// # Safety
    /// Both device buffers hold `bytes` bytes and do not overlap.
    pub unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> anyhow::Result<()> {
        result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())?;
        Ok(())
    }

    pub fn memset(&self, dst: u64, byte: u8, bytes: usize) -> anyhow::Result<()> {
        // SAFETY: the caller's buffer at `dst` holds `bytes` bytes.
        unsafe { result::memset_d8_async(dst, byte, bytes, self.stream.cu_stream()) }?;
        Ok(())
    }

    pub fn sync(&self) -> anyhow::Result<()> {
        self.stream.synchronize()?;
        Ok(())
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> anyhow::Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Launches `name` with one parameter struct.
    ///
    /// # Safety
    /// `P` must match the kernel's parameter struct, and every pointer in it must be valid for
    /// what the kernel reads and writes.
    pub unsafe fn launch<P: Copy>(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: &P,
    ) -> anyhow::Result<()> {
        let k = self.kernel(name);
        launch_with(&k.f, name, &self.stream, grid, block, k.smem, params)?;
        self.traced(name)
    }

    /// Starts timing each launch on the compute stream (`traced`) until `take_trace`. For
    /// benchmarks of steps that are not replayed from a CUDA graph: it records events between
    /// the launches, so it also costs a little time of its own.
    pub fn start_trace(&self) -> anyhow::Result<()> {
        let start = self.trace_event()?;
        *self.trace.lock().expect("trace lock") = Some(vec![(String::new(), start)]);
        self.tracing.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Stops tracing, waits for the stream and returns each traced launch's name with the ms
    /// from the previous launch's end (or the trace's start) to its own end: its run time plus
    /// any gap before it.
    pub fn take_trace(&self) -> anyhow::Result<Vec<(String, f64)>> {
        self.tracing.store(false, Ordering::Relaxed);
        let events = self.trace.lock().expect("trace lock").take();
        self.sync()?;
        let events = events.unwrap_or_default();
        events
            .windows(2)
            .map(|w| Ok((w[1].0.clone(), w[0].1.elapsed_ms(&w[1].1)? as f64)))
            .collect()
    }

    /// Marks the end of launch `name` on the compute stream while a trace is on.
    pub fn traced(&self, name: impl std::fmt::Display) -> anyhow::Result<()> {
        if !self.tracing.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut trace = self.trace.lock().expect("trace lock");
        if let Some(events) = trace.as_mut() {
            events.push((name.to_string(), self.trace_event()?));
        }
        Ok(())
    }

    /// A timing event recorded on the compute stream now.
    fn trace_event(&self) -> anyhow::Result<CudaEvent> {
        let event = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        event.record(&self.stream)?;
        Ok(event)
    }

    /// Compiles (or takes from the PTX cache) `src` (kernels/`file`.cu) for `arch` with `defines`
    /// and loads each of its kernels under its name + `suffix`.
    fn build(
        &mut self,
        (file, src): (&str, &str),
        arch: &str,
        defines: &[(&str, usize)],
        suffix: &str,
    ) -> anyhow::Result<()> {
        let (ptx, _) = compile::ptx_with(file, src, arch, defines)?;
        load_module(&self.ctx, file, ptx, defines, suffix, &mut self.functions)
    }

    /// Lets the loaded kernel `name` take `bytes` of dynamic shared memory (past the 48 KB
    /// default), with which every launch of it then runs.
    fn set_dyn_smem(&mut self, name: &str, bytes: usize) -> anyhow::Result<()> {
        self.function(name)
            .set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .with_context(|| format!("{name}: {bytes} bytes of dynamic shared memory"))?;
        if let Some(k) = self.functions.get_mut(name) {
            k.smem = bytes as u32;
        }
        Ok(())
    }

    /// Launches `name`, a kernel that calls `pdl_wait()` before reading what earlier kernels
    /// wrote, with programmatic dependent launch when `self.pdl` (else as `launch`).
    ///
    /// # Safety
    /// As `launch`.
    pub unsafe fn launch_pdl<P: Copy>(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: &P,
    ) -> anyhow::Result<()> {
        let k = self.kernel(name);
        self.launch_kernel_pdl(k, name, (grid, block, k.smem), params)
    }

    /// `launch_pdl` with `smem` bytes of dynamic shared memory instead of the kernel's own (at
    /// most what `set_dyn_smem` allowed it).
    ///
    /// # Safety
    /// As `launch`; the kernel must need no more than `smem` bytes.
    pub unsafe fn launch_pdl_smem<P: Copy>(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        params: &P,
    ) -> anyhow::Result<()> {
        let k = self.kernel(name);
        anyhow::ensure!(
            smem <= k.smem.max(48 << 10),
            "{name}: {smem} bytes of shared memory asked, {} allowed",
            k.smem
        );
        self.launch_kernel_pdl(k, name, (grid, block, smem), params)
    }

    /// `launch_pdl`'s body for a kernel already looked up, with `smem` bytes of dynamic shared
    /// memory.
    unsafe fn launch_kernel_pdl<P: Copy>(
        &self,
        k: &Kernel,
        name: &str,
        (grid, block, smem): ((u32, u32, u32), (u32, u32, u32), u32),
        params: &P,
    ) -> anyhow::Result<()> {
        match self.pdl {
            true => launch_pdl_with(&k.f, name, &self.stream, (grid, block, smem), params)?,
            false => launch_with(&k.f, name, &self.stream, grid, block, smem, params)?,
        }
        self.traced(name)
    }

    /// `launch_pdl` where `pdl_small` has `bit`, else `launch`: the element-wise kernels between
    /// the decode projections (their `pdl_wait` is a no-op in a normal launch).
    ///
    /// # Safety
    /// As `launch`.
    pub unsafe fn launch_small<P: Copy>(
        &self,
        bit: u32,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: &P,
    ) -> anyhow::Result<()> {
        match self.pdl_small & bit != 0 {
            true => self.launch_pdl(name, grid, block, params),
            false => self.launch(name, grid, block, params),
        }
    }

    /// `launch_pdl` in thread-block clusters of `cluster` CTAs along x (sm_90; the grid's x a
    /// multiple of it): the decode kernels' splits merged in distributed shared memory.
    ///
    /// # Safety
    /// As `launch`.
    pub unsafe fn launch_pdl_cluster<P: Copy>(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        cluster: u32,
        params: &P,
    ) -> anyhow::Result<()> {
        let k = self.kernel(name);
        let mut dims = launch_attr(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
        dims.value.clusterDim.x = cluster;
        dims.value.clusterDim.y = 1;
        dims.value.clusterDim.z = 1;
        let mut attrs = [dims, pdl_attr()];
        let n = if self.pdl { 2 } else { 1 };
        launch_ex(
            &k.f,
            &self.stream,
            (grid, block, k.smem),
            params,
            &mut attrs[..n],
        )
        .with_context(|| format!("launching {name} in clusters of {cluster}"))?;
        self.traced(name)
    }

    /// Launches a kernel the caller loaded itself (benchmarks of kernel variants), with `smem`
    /// bytes of dynamic shared memory (past 48 KB the caller set the function's limit).
    ///
    /// # Safety
    /// As `launch`.
    pub unsafe fn launch_fn<P: Copy>(
        &self,
        f: &CudaFunction,
        name: &str,
        (grid, block, smem): ((u32, u32, u32), (u32, u32, u32), u32),
        params: &P,
    ) -> anyhow::Result<()> {
        launch_with(f, name, &self.stream, grid, block, smem, params)
    }

    /// `launch_fn` with programmatic dependent launch when `self.pdl` (the kernel calls
    /// `pdl_wait()` before reading what earlier kernels wrote).
    ///
    /// # Safety
    /// As `launch`.
    pub unsafe fn launch_fn_pdl<P: Copy>(
        &self,
        f: &CudaFunction,
        name: &str,
        shape: ((u32, u32, u32), (u32, u32, u32), u32),
        params: &P,
    ) -> anyhow::Result<()> {
        match self.pdl {
            true => launch_pdl_with(f, name, &self.stream, shape, params),
            false => self.launch_fn(f, name, shape, params),
        }
    }

    /// `launch_fn` as a cooperative launch: every CTA of the grid resident at once (or an
    /// error), for kernels with grid barriers (kernels/gemv_chain.cu).
    ///
    /// # Safety
    /// As `launch`.
    pub unsafe fn launch_fn_coop<P: Copy>(
        &self,
        f: &CudaFunction,
        name: &str,
        shape: ((u32, u32, u32), (u32, u32, u32), u32),
        params: &P,
    ) -> anyhow::Result<()> {
        let mut attr = launch_attr(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
        attr.value.cooperative = 1;
        launch_ex(
            f,
            &self.stream,
            shape,
            params,
            std::slice::from_mut(&mut attr),
        )
        .with_context(|| format!("launching {name} (cooperative)"))
    }

    /// Launches `name` on `stream` rather than the compute stream (the KV tier's copy stream).
    ///
    /// # Safety
    /// As `launch`.
    pub unsafe fn launch_on<P: Copy>(
        &self,
        stream: &CudaStream,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: &P,
    ) -> anyhow::Result<()> {
        let k = self.kernel(name);
        launch_with(&k.f, name, stream, grid, block, k.smem, params)
    }
}

/// # Safety
/// As `Gpu::launch`.
unsafe fn launch_with<P: Copy>(
    f: &CudaFunction,
    name: &str,
    stream: &CudaStream,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
    params: &P,
) -> anyhow::Result<()> {
    let mut args = [params as *const P as *mut c_void];
    result::launch_kernel(
        f.cu_function(),
        grid,
        block,
        smem,
        stream.cu_stream(),
        &mut args,
    )
    .with_context(|| format!("launching {name}"))
}

/// # Safety
/// As `Gpu::launch`; the kernel calls `pdl_wait()` before reading earlier kernels' outputs.
unsafe fn launch_pdl_with<P: Copy>(
    f: &CudaFunction,
    name: &str,
    stream: &CudaStream,
    shape: ((u32, u32, u32), (u32, u32, u32), u32),
    params: &P,
) -> anyhow::Result<()> {
    let mut attr = pdl_attr();
    launch_ex(f, stream, shape, params, std::slice::from_mut(&mut attr))
        .with_context(|| format!("launching {name} (PDL)"))
}

/// A launch attribute of kind `id`, its value zeroed for the caller to set.
fn launch_attr(id: sys::CUlaunchAttributeID) -> sys::CUlaunchAttribute {
    // SAFETY: a plain C struct and union of integers, for which all zeroes is a valid value.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = id;
    attr
}

/// Programmatic dependent launch: the kernel may start while the one before it on the stream
/// runs (it calls `pdl_wait()` before reading that kernel's outputs).
fn pdl_attr() -> sys::CUlaunchAttribute {
    let mut attr = launch_attr(
        sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
    );
    attr.value.programmaticStreamSerializationAllowed = 1;
    attr
}

/// # Safety
/// As `Gpu::launch`.
unsafe fn launch_ex<P: Copy>(
    f: &CudaFunction,
    stream: &CudaStream,
    (grid, block, smem): ((u32, u32, u32), (u32, u32, u32), u32),
    params: &P,
    attrs: &mut [sys::CUlaunchAttribute],
) -> Result<(), cudarc::driver::DriverError> {
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: smem,
        hStream: stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    let mut args = [params as *const P as *mut c_void];
    sys::cuLaunchKernelEx(
        &config,
        f.cu_function(),
        args.as_mut_ptr(),
        std::ptr::null_mut(),
    )
    .result()
}

/// A cuBLAS handle on `stream` with a workspace of its own (the handle must outlive neither).
fn blas_on(stream: &Arc<CudaStream>) -> anyhow::Result<(CudaBlas, DevBuf)> {
    let blas = CudaBlas::new(stream.clone()).context("creating the cuBLAS handle")?;
    let ws = alloc_on(stream, CUBLAS_WORKSPACE_BYTES)?;
    // SAFETY: the caller keeps the workspace as long as the handle (both in one `Gpu`).
    unsafe {
        cublas_sys::cublasSetWorkspace_v2(*blas.handle(), ws.ptr() as *mut c_void, ws.bytes())
            .result()
            .context("cublasSetWorkspace")?;
    }
    Ok((blas, ws))
}

fn alloc_on(stream: &Arc<CudaStream>, bytes: usize) -> anyhow::Result<DevBuf> {
    // SAFETY: the contents are unset; every user writes before it reads.
    let slice = unsafe { stream.alloc::<u8>(bytes.max(1)) }.with_context(|| {
        format!(
            "allocating {:.1} MiB on the GPU",
            bytes as f64 / (1 << 20) as f64
        )
    })?;
    let ptr = slice.device_ptr(stream).0;
    Ok(DevBuf {
        _slice: slice,
        ptr,
        bytes,
    })
}

/// A loaded kernel and the dynamic shared memory it launches with (0 unless its loader set
/// it, past the 48 KB default, with `set_dyn_smem`).
#[derive(Clone)]
struct Kernel {
    f: CudaFunction,
    smem: u32,
}

/// Loads `ptx` (kernels/`name`.cu built with `defines`) and every kernel in it into
/// `functions`, each as its name + `suffix`.
fn load_module(
    ctx: &Arc<CudaContext>,
    name: &str,
    ptx: Ptx,
    defines: &[(&str, usize)],
    suffix: &str,
    functions: &mut HashMap<String, Kernel>,
) -> anyhow::Result<()> {
    // The PTX's entries, not the source's declarations: kernels made by a macro or left out by
    // `#if` are named right only there.
    let entries = ptx_entries(&ptx.to_src());
    let module = ctx
        .load_module(ptx)
        .with_context(|| format!("loading kernels/{name}.cu {defines:?}"))?;
    for f in entries {
        let func = module
            .load_function(&f)
            .with_context(|| format!("kernel {f} in kernels/{name}.cu {defines:?}"))?;
        functions.insert(format!("{f}{suffix}"), Kernel { f: func, smem: 0 });
    }
    Ok(())
}

fn load_kernels(
    ctx: &Arc<CudaContext>,
    (major, minor): (i32, i32),
) -> anyhow::Result<HashMap<String, Kernel>> {
    anyhow::ensure!(major >= 8, "brook's CUDA kernels need compute capability 8.0 or newer (bf16 tensor cores); this GPU has {major}.{minor}");
    let arch = compile::arch_for(major, minor);
    let mut functions = HashMap::new();
    let started = std::time::Instant::now();
    let mut compiled = 0;
    for (name, src) in compile::SOURCES {
        let (ptx, cached) = compile::ptx_for(name, src, &arch)?;
        compiled += usize::from(!cached);
        load_module(ctx, name, ptx, &[], "", &mut functions)?;
    }
    tracing::info!(
        "CUDA kernels ready for {arch} in {:.0} ms ({compiled} of {} modules compiled, the rest from the PTX cache)",
        started.elapsed().as_secs_f64() * 1e3,
        compile::SOURCES.len()
    );
    Ok(functions)
}

/// The `extern "C"` kernels (`.entry`) of a PTX module; C++-mangled entries (`_Z…`) are
/// template instances that no launch names.
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|line| line.split_once(".entry ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.starts_with("_Z"))
        .map(str::to_string)
        .collect()
}

/// Names of the `extern "C" __global__` functions written out in a source (not those a macro
/// makes: `ptx_entries` has every one).
fn kernel_names(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_macro = false;
    for line in src.lines() {
        let line = line.trim();
        let macro_line = in_macro || line.starts_with("#define");
        in_macro = macro_line && line.ends_with('\\');
        if macro_line {
            continue; // macro bodies, to their last continued line
        }
        if let Some(rest) = line.strip_prefix("extern \"C\" __global__ void ") {
            // Skip `__launch_bounds__(...)`; the name is the identifier before the next '('.
            let rest = match rest.strip_prefix("__launch_bounds__(") {
                Some(r) => r.split_once(')').map(|(_, r)| r).unwrap_or(""),
                None => rest,
            };
            if let Some(name) = rest
                .split('(')
                .next()
                .map(str::trim)
                .filter(|n| !n.is_empty())
            {
                names.push(name.to_string());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_found_in_every_source() {
        let all: Vec<String> = compile::SOURCES
            .iter()
            .chain([&compile::PAGED_DECODE, &compile::PREFILL_ATTN])
            .flat_map(|(_, s)| kernel_names(s))
            .collect();
        for want in [
            "embedding",
            "add_rmsnorm",
            "rope_kv",
            "silu_mul",
            "paged_decode",
            "paged_decode_mma",
            "paged_decode_reduce",
            "prefill_attn",
            "kv_gather",
            "kv_stage",
            "causal_softmax",
            "sample",
            "gemv_m1",
            "fill_uniform",
        ] {
            assert!(all.iter().any(|n| n == want), "{want} missing from {all:?}");
        }
        // Macro bodies are not declarations (gemv_bulk.cu's GB_KERNEL once gave a
        // "__launch_bounds__ bounds name" kernel that no module has).
        assert!(all.iter().all(|n| !n.contains(' ')), "{all:?}");
    }

    #[test]
    fn ptx_entries_are_the_extern_c_kernels() {
        let ptx = ".visible .entry gemv_bulk_m1(\n\t.param .align 8 .b8 p[64]\n)\n\
                   .weak .entry _Z9templatedILi1EEvv(\n)\n.visible .entry silu_mul (\n)\n\
                   .func (.reg .b32 r) helper(\n)\n";
        assert_eq!(ptx_entries(ptx), ["gemv_bulk_m1", "silu_mul"]);
    }
}
