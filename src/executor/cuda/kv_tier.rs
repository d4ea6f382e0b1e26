//! The CUDA backend's side of the KV memory tier (`executor::kv_tier`): the host tier in pinned
//! (page-locked) host memory, and a step's block copies on a copy stream of their own,
//! overlapped with the forwards.
//!
//! Layouts. Device pool: `2 * layers` planes (layer l's K is plane 2l, its V plane 2l + 1),
//! each `num_blocks` blocks of `plane_bytes` (`Forward::kv_layout`). Host tier: block-major,
//! one block's planes contiguous (`bytes_per_block`), so a swapped block is one host range.
//!
//! Gathered copies. A block is `planes` pieces of `plane_bytes` (128 KiB for Llama-2-7B at
//! bf16, 64 KiB with an fp8 cache), far too small to reach the link's bandwidth one copy each. So a batch of device → host copies is
//! gathered by one kernel (`kv_stage`) into a device staging buffer laid out as the host tier,
//! then copied in one transfer per run of consecutive host blocks; host → device is the
//! reverse (one transfer, then one scatter). The list is cut into segments within which order
//! does not matter (`step::kv_copy::segments`), so batching by kind keeps the list's meaning.
//! `gathered = false` copies per block and plane instead (the benchmark compares both).
//!
//! Ordering, all on the device (no host sync in a step):
//! - the copy stream first waits for the compute stream (an event), so no copy reads a block
//!   before the previous forward wrote it, nor writes one that forward still reads;
//! - the leading copies this step's forward needs (`kv_copies_for_forward`: write-backs of
//!   blocks it reuses, copy-on-write) are followed by an event the compute stream waits on;
//! - the rest run while the forward computes (the KV manager fenced their blocks off it:
//!   `kv::manager::in_flight`), and an event after the last one is waited on by the compute
//!   stream before the next step's forward (`wait_landed`): no kernel ever reads a block
//!   before its copy has landed.
//!
//! Host blocks are never read on the host while copies run (only tests read them, after `sync`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use cudarc::driver::{result, CudaEvent, CudaStream, PinnedHostSlice};

use super::device::{DevBuf, Gpu};
use super::kernels::{kv_stage, KvStageParams, KV_STAGE_MAX_BLOCKS};
use crate::executor::kv_tier::check_copies;
use crate::step::kv_copy::{runs, segments};
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

impl KvLayout {
    fn block_bytes(&self) -> usize {
        self.planes * self.plane_bytes
    }

    /// Block `b`'s piece of plane `p`.
    fn at(&self, p: usize, b: usize) -> u64 {
        self.base + (p * self.plane_stride + b * self.plane_bytes) as u64
    }
}

/// Device staging for gathered copies: about this many bytes (whole blocks, at least one, at
/// most a `kv_stage` launch's worth). Each transfer of a batch is up to this size: large
/// enough for the link's full bandwidth, small beside the KV pool.
const STAGING_BYTES: usize = 64 << 20;

pub struct CudaKvTier {
    /// None without a host tier (the copy stream still serves copy-on-write).
    host: Option<PinnedHostSlice<u8>>,
    /// `host`'s address: taken once (reading it through cudarc syncs an event each time).
    host_ptr: usize,
    num_host_blocks: usize,
    copy: Arc<CudaStream>,
    bytes_per_s: f64,
    /// Gathered copies' device staging (None without a host tier, or when the layout does not
    /// allow 16-byte moves), and the blocks it holds.
    staging: Option<DevBuf>,
    staging_blocks: usize,
    /// Gather through `staging` (default when there is one) or copy per block and plane.
    gathered: bool,
    /// Recorded on the compute stream; the copy stream waits on it before a step's copies.
    computed: CudaEvent,
    /// Recorded after the copies a forward needs; the compute stream waits on it.
    ready: CudaEvent,
    /// Recorded after a step's last copy; the next forward waits on it (`pending`).
    landed: CudaEvent,
    pending: bool,
}

impl CudaKvTier {
    /// Allocates `num_host_blocks` blocks of pinned host memory, the staging buffer and a copy
    /// stream, then measures the copy bandwidth (device → host and back over up to 64 blocks).
    pub fn new(gpu: &Gpu, layout: &KvLayout, num_host_blocks: usize) -> anyhow::Result<Self> {
        let ctx = &gpu.ctx;
        let block_bytes = layout.block_bytes();
        let bytes = num_host_blocks * block_bytes;
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
        let aligned = layout.plane_bytes % 16 == 0 && layout.plane_stride % 16 == 0;
        let staging_blocks = (STAGING_BYTES / block_bytes.max(1)).clamp(1, KV_STAGE_MAX_BLOCKS);
        let staging = if host.is_some() && aligned {
            let b = gpu
                .alloc(staging_blocks * block_bytes)
                .context("allocating the KV tier's staging buffer")?;
            Some(b)
        } else {
            None
        };
        let copy = ctx.new_stream()?;
        let mut t = CudaKvTier {
            host,
            host_ptr,
            num_host_blocks,
            copy,
            bytes_per_s: 0.0,
            gathered: staging.is_some(),
            staging,
            staging_blocks,
            computed: ctx.new_event(None)?,
            ready: ctx.new_event(None)?,
            landed: ctx.new_event(None)?,
            pending: false,
        };
        if t.host.is_some() {
            t.bytes_per_s = t.measure(gpu, layout)?;
        }
        Ok(t)
    }

    pub fn num_blocks(&self) -> usize {
        self.num_host_blocks
    }

    pub fn bytes_per_s(&self) -> f64 {
        self.bytes_per_s
    }

    /// Gathered copies (true, when a staging buffer exists) or per block and plane (false):
    /// the benchmark measures both. Returns what is in effect.
    pub fn set_gathered(&mut self, on: bool) -> bool {
        self.gathered = on && self.staging.is_some();
        self.gathered
    }

    /// Makes the compute stream wait for every copy enqueued so far (before a forward, or
    /// anything else that reads the pool).
    pub fn wait_landed(&mut self, compute: &CudaStream) -> anyhow::Result<()> {
        if std::mem::take(&mut self.pending) {
            compute.wait(&self.landed)?;
        }
        Ok(())
    }

    /// Enqueues a step's `copies` on the copy stream behind the compute stream's work; the
    /// compute stream waits for the first `for_forward` of them (this step's forward needs
    /// them) and for every earlier step's. The rest overlap the forward; `wait_landed` (the
    /// next step's `apply`) orders them before the next. Returns at once (asynchronous).
    pub fn apply(
        &mut self,
        gpu: &Gpu,
        layout: &KvLayout,
        copies: &[BlockCopy],
        for_forward: usize,
    ) -> anyhow::Result<()> {
        check_copies(copies, layout.num_blocks, self.num_host_blocks)?;
        let compute = &gpu.stream;
        self.wait_landed(compute)?;
        if copies.is_empty() {
            return Ok(());
        }
        // Events made once and recorded again each step (a `join` would create one per call).
        self.computed.record(compute)?;
        self.copy.wait(&self.computed)?;
        let split = for_forward.min(copies.len());
        let (needed, overlapped) = copies.split_at(split);
        if !needed.is_empty() {
            self.enqueue(gpu, layout, needed)?;
            self.ready.record(&self.copy)?;
            compute.wait(&self.ready)?;
        }
        if !overlapped.is_empty() {
            self.enqueue(gpu, layout, overlapped)?;
            self.landed.record(&self.copy)?;
            self.pending = true;
        }
        Ok(())
    }

    /// Enqueues `copies` on the copy stream, as if one by one in order.
    fn enqueue(&self, gpu: &Gpu, layout: &KvLayout, copies: &[BlockCopy]) -> anyhow::Result<()> {
        if !self.gathered {
            return self.per_plane(layout, copies);
        }
        let mut start = 0;
        for end in segments(copies) {
            let seg = &copies[start..end];
            start = end;
            let of = |k: CopyKind| seg.iter().filter(move |c| c.kind == k).copied();
            let d2d: Vec<BlockCopy> = of(CopyKind::DeviceToDevice).collect();
            self.per_plane(layout, &d2d)?;
            let out: Vec<BlockCopy> = of(CopyKind::DeviceToHost).collect();
            for chunk in out.chunks(self.staging_blocks) {
                self.staged(gpu, layout, chunk, true)?;
            }
            let back: Vec<BlockCopy> = of(CopyKind::HostToDevice).collect();
            for chunk in back.chunks(self.staging_blocks) {
                self.staged(gpu, layout, chunk, false)?;
            }
        }
        Ok(())
    }

    /// One staged batch (at most `staging_blocks`, one kind): device → host is a gather into
    /// the staging buffer, then one transfer per run of consecutive host blocks; host → device
    /// the transfers, then one scatter.
    fn staged(
        &self,
        gpu: &Gpu,
        layout: &KvLayout,
        chunk: &[BlockCopy],
        out: bool,
    ) -> anyhow::Result<()> {
        let staging = self.staging.as_ref().expect("gathered copies have staging");
        let block_bytes = layout.block_bytes();
        let mut p = KvStageParams {
            pool: layout.base,
            staging: staging.ptr(),
            plane_stride: layout.plane_stride as i64,
            plane_bytes: layout.plane_bytes as i64,
            planes: layout.planes as i32,
            n: chunk.len() as i32,
            to_staging: i32::from(out),
            blocks: [0; KV_STAGE_MAX_BLOCKS],
        };
        for (slot, c) in p.blocks.iter_mut().zip(chunk) {
            *slot = (if out { c.src } else { c.dst }) as i32;
        }
        let s = self.copy.cu_stream();
        if out {
            // SAFETY: every id was checked against the pool; staging holds `staging_blocks`.
            unsafe { kv_stage(gpu, &self.copy, &p) }?;
        }
        // Host side of each staging slot, merged into runs of consecutive host blocks.
        let host_of = |c: &BlockCopy| (if out { c.dst } else { c.src }) as usize;
        let mut i = 0;
        while i < chunk.len() {
            let first = host_of(&chunk[i]);
            let mut n = 1;
            while i + n < chunk.len() && host_of(&chunk[i + n]) == first + n {
                n += 1;
            }
            let dev = staging.ptr() + (i * block_bytes) as u64;
            let at = self.host_ptr + first * block_bytes;
            let len = n * block_bytes;
            // SAFETY: `at .. + len` lies in `host` (ids checked) and `dev .. + len` in staging;
            // pinned memory outlives the stream's work (`Drop` syncs).
            unsafe {
                if out {
                    let h = std::slice::from_raw_parts_mut(at as *mut u8, len);
                    result::memcpy_dtoh_async(h, dev, s)?;
                } else {
                    let h = std::slice::from_raw_parts(at as *const u8, len);
                    result::memcpy_htod_async(dev, h, s)?;
                }
            }
            i += n;
        }
        if !out {
            // SAFETY: as above; a segment writes each device block once, so the ids are distinct.
            unsafe { kv_stage(gpu, &self.copy, &p) }?;
        }
        Ok(())
    }

    /// Copies in list order, one memcpy per plane and run of consecutive ids (device → device,
    /// and towards the host per block and plane: the host tier is block-major).
    fn per_plane(&self, layout: &KvLayout, copies: &[BlockCopy]) -> anyhow::Result<()> {
        let block_bytes = layout.block_bytes();
        let s = self.copy.cu_stream();
        for (c, n) in runs(copies) {
            let (src, dst) = (c.src as usize, c.dst as usize);
            for p in 0..layout.planes {
                let host = |b: usize| self.host_ptr + b * block_bytes + p * layout.plane_bytes;
                for i in 0..n {
                    // SAFETY: host ranges lie in `host` (ids checked), and pinned memory
                    // outlives the stream's work (`Drop` syncs).
                    unsafe {
                        match c.kind {
                            CopyKind::DeviceToHost => {
                                let h = std::slice::from_raw_parts_mut(
                                    host(dst + i) as *mut u8,
                                    layout.plane_bytes,
                                );
                                result::memcpy_dtoh_async(h, layout.at(p, src + i), s)?;
                            }
                            CopyKind::HostToDevice => {
                                let h = std::slice::from_raw_parts(
                                    host(src + i) as *const u8,
                                    layout.plane_bytes,
                                );
                                result::memcpy_htod_async(layout.at(p, dst + i), h, s)?;
                            }
                            // A run is consecutive on the device: one copy per plane. Source
                            // and destination never overlap (copy-on-write takes a free block).
                            CopyKind::DeviceToDevice if i == 0 => result::memcpy_dtod_async(
                                layout.at(p, dst),
                                layout.at(p, src),
                                n * layout.plane_bytes,
                                s,
                            )?,
                            CopyKind::DeviceToDevice => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits for every enqueued copy (tests read host blocks after it).
    pub fn sync(&self) -> anyhow::Result<()> {
        self.copy.synchronize()?;
        Ok(())
    }

    /// Host block `b`'s bytes, planes in order (tests; after `sync`).
    pub fn host_block(&self, b: usize, layout: &KvLayout) -> Vec<u8> {
        let n = layout.block_bytes();
        assert!(b < self.num_host_blocks);
        // SAFETY: in bounds; the caller synced the copy stream.
        unsafe { std::slice::from_raw_parts((self.host_ptr + b * n) as *const u8, n) }.to_vec()
    }

    /// Bytes per second one way: `rounds` device → host and host → device copies of up to 64
    /// blocks (their contents come back to where they were), timed on the host around a sync.
    fn measure(&mut self, gpu: &Gpu, layout: &KvLayout) -> anyhow::Result<f64> {
        let n = layout.num_blocks.min(self.num_host_blocks).min(64);
        if n == 0 {
            return Ok(0.0);
        }
        let out: Vec<BlockCopy> = (0..n as u32).map(|b| BlockCopy::to_host(b, b)).collect();
        let back: Vec<BlockCopy> = (0..n as u32).map(|b| BlockCopy::to_device(b, b)).collect();
        let round = |t: &mut Self| -> anyhow::Result<()> {
            t.apply(gpu, layout, &out, out.len())?;
            t.apply(gpu, layout, &back, back.len())
        };
        round(self)?;
        self.sync()?;
        let rounds = 4;
        let start = Instant::now();
        for _ in 0..rounds {
            round(self)?;
        }
        self.sync()?;
        let s = start.elapsed().as_secs_f64().max(1e-9);
        let bytes = 2 * rounds * n * layout.block_bytes();
        Ok(bytes as f64 / s)
    }
}

impl Drop for CudaKvTier {
    fn drop(&mut self) {
        // The pinned memory must outlive the copies that use it.
        let _ = self.copy.synchronize();
    }
}
