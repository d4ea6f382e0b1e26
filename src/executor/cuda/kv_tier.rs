//! The CUDA backend's side of the KV memory tier (`executor::kv_tier`): the host tier in pinned
//! (page-locked) host memory, and a step's block copies on a copy stream of their own.
//!
//! Layouts. Device pool: `2 * layers` planes (layer l's K is plane 2l, its V plane 2l + 1),
//! each `num_blocks` blocks of `plane_bytes` (`Forward::kv_layout`). Host tier: block-major,
//! one block's planes contiguous (`bytes_per_block`), so a swapped block is one host range.
//!
//! Ordering. The copy stream first waits for the compute stream (an event recorded there), so
//! no copy reads a block before the last forward wrote it; the copies run in list order (runs
//! of consecutive ids as one memcpy per plane, `step::kv_copy::runs`); then an event recorded
//! on the copy stream is waited on by the compute stream before this step's forward, so no
//! kernel reads a block before its copy has landed. The host-side preparation of the step
//! (input diffs, table uploads) overlaps the copies. Host blocks are never read on the host
//! while copies run (only tests read them, after `sync`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use cudarc::driver::{result, CudaStream, PinnedHostSlice};

use crate::executor::kv_tier::check_copies;
use crate::step::kv_copy::runs;
use crate::step::{BlockCopy, CopyKind};

/// Device pool layout: base pointer, bytes between planes, planes, bytes of one block in one
/// plane, blocks.
#[derive(Debug, Clone, Copy)]
pub struct KvLayout {
    pub base: u64,
    pub plane_stride: usize,
    pub planes: usize,
    pub plane_bytes: usize,
    pub num_blocks: usize,
}

pub struct CudaKvTier {
    /// None without a host tier (the copy stream still serves copy-on-write).
    host: Option<PinnedHostSlice<u8>>,
    /// `host`'s address: taken once (reading it through cudarc syncs an event each time).
    host_ptr: usize,
    num_host_blocks: usize,
    copy: Arc<CudaStream>,
    bytes_per_s: f64,
}

impl CudaKvTier {
    /// Allocates `num_host_blocks` blocks of pinned host memory and a copy stream, then
    /// measures the copy bandwidth (device → host and back over up to 64 blocks).
    pub fn new(
        compute: &Arc<CudaStream>,
        layout: &KvLayout,
        num_host_blocks: usize,
    ) -> anyhow::Result<Self> {
        let ctx = compute.context();
        let bytes = num_host_blocks * layout.planes * layout.plane_bytes;
        let (host, host_ptr) = if bytes == 0 {
            (None, 0)
        } else {
            // SAFETY: pinned memory is uninitialised until a copy writes it; nothing reads a
            // host block before a device → host copy wrote it (the KV manager's order).
            // Flags 0: plain page-locked memory (not write-combined, so tests can read it).
            let mut h = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }
                .with_context(|| format!("allocating {bytes} bytes of pinned host memory"))?;
            let ptr = h.as_mut_ptr()? as usize;
            (Some(h), ptr)
        };
        let copy = ctx.new_stream()?;
        let mut t = CudaKvTier {
            host,
            host_ptr,
            num_host_blocks,
            copy,
            bytes_per_s: 0.0,
        };
        if t.host.is_some() {
            t.bytes_per_s = t.measure(compute, layout)?;
        }
        Ok(t)
    }

    pub fn num_blocks(&self) -> usize {
        self.num_host_blocks
    }

    pub fn bytes_per_s(&self) -> f64 {
        self.bytes_per_s
    }

    /// Enqueues `copies` on the copy stream behind the compute stream's work, and makes the
    /// compute stream wait for them. Returns at once (asynchronous).
    pub fn apply(
        &mut self,
        compute: &CudaStream,
        layout: &KvLayout,
        copies: &[BlockCopy],
    ) -> anyhow::Result<()> {
        check_copies(copies, layout.num_blocks, self.num_host_blocks)?;
        if copies.is_empty() {
            return Ok(());
        }
        self.copy.join(compute)?;
        let block_bytes = layout.planes * layout.plane_bytes;
        let s = self.copy.cu_stream();
        for (c, n) in runs(copies) {
            let (src, dst) = (c.src as usize, c.dst as usize);
            for p in 0..layout.planes {
                let plane = layout.base + (p * layout.plane_stride) as u64;
                let dev = |b: usize| plane + (b * layout.plane_bytes) as u64;
                let len = n * layout.plane_bytes;
                match c.kind {
                    // A run of n blocks is n host blocks apart per plane: one copy per block.
                    CopyKind::DeviceToHost => {
                        for i in 0..n {
                            let at =
                                self.host_ptr + (dst + i) * block_bytes + p * layout.plane_bytes;
                            // SAFETY: `at .. + plane_bytes` lies in `host` (ids checked), and
                            // pinned memory outlives the stream's work (`Drop` syncs).
                            let h = unsafe {
                                std::slice::from_raw_parts_mut(at as *mut u8, layout.plane_bytes)
                            };
                            unsafe { result::memcpy_dtoh_async(h, dev(src + i), s) }?;
                        }
                    }
                    CopyKind::HostToDevice => {
                        for i in 0..n {
                            let at =
                                self.host_ptr + (src + i) * block_bytes + p * layout.plane_bytes;
                            // SAFETY: as above.
                            let h = unsafe {
                                std::slice::from_raw_parts(at as *const u8, layout.plane_bytes)
                            };
                            unsafe { result::memcpy_htod_async(dev(dst + i), h, s) }?;
                        }
                    }
                    CopyKind::DeviceToDevice => {
                        // SAFETY: both ranges lie in the pool (ids checked); a run's source and
                        // destination never overlap (copy-on-write takes a free block).
                        unsafe { result::memcpy_dtod_async(dev(dst), dev(src), len, s) }?;
                    }
                }
            }
        }
        compute.join(&self.copy)?;
        Ok(())
    }

    /// Waits for every enqueued copy (tests read host blocks after it).
    pub fn sync(&self) -> anyhow::Result<()> {
        self.copy.synchronize()?;
        Ok(())
    }

    /// Host block `b`'s bytes, planes in order (tests; after `sync`).
    pub fn host_block(&self, b: usize, layout: &KvLayout) -> Vec<u8> {
        let n = layout.planes * layout.plane_bytes;
        assert!(b < self.num_host_blocks);
        // SAFETY: in bounds; the caller synced the copy stream.
        unsafe { std::slice::from_raw_parts((self.host_ptr + b * n) as *const u8, n) }.to_vec()
    }

    /// Bytes per second one way: `rounds` device → host and host → device copies of up to 64
    /// blocks (their contents come back to where they were), timed on the host around a sync.
    fn measure(&mut self, compute: &Arc<CudaStream>, layout: &KvLayout) -> anyhow::Result<f64> {
        let n = layout.num_blocks.min(self.num_host_blocks).min(64);
        if n == 0 {
            return Ok(0.0);
        }
        let out: Vec<BlockCopy> = (0..n as u32).map(|b| BlockCopy::to_host(b, b)).collect();
        let back: Vec<BlockCopy> = (0..n as u32).map(|b| BlockCopy::to_device(b, b)).collect();
        self.apply(compute, layout, &out)?;
        self.apply(compute, layout, &back)?;
        self.sync()?;
        let rounds = 4;
        let start = Instant::now();
        for _ in 0..rounds {
            self.apply(compute, layout, &out)?;
            self.apply(compute, layout, &back)?;
        }
        self.sync()?;
        let s = start.elapsed().as_secs_f64().max(1e-9);
        let bytes = 2 * rounds * n * layout.planes * layout.plane_bytes;
        Ok(bytes as f64 / s)
    }
}

impl Drop for CudaKvTier {
    fn drop(&mut self) {
        // The pinned memory must outlive the copies that use it.
        let _ = self.copy.synchronize();
    }
}
