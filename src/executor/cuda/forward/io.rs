//! A step's copies between host and device: the metadata up, the sampled tokens (and timing
//! stamps) back.
//!
//! Two ways, chosen by `CudaBackendOptions::pinned_io`:
//! - pageable (the default): the metadata is uploaded from a `Vec`, tokens and log-probabilities
//!   are copied back into `Vec`s and the host synchronises the stream. A pageable copy is staged
//!   by the driver through its own pinned buffer, and a copy back from the device waits for the
//!   stream before it returns.
//! - pinned: page-locked staging buffers, one async copy up per step, and the outputs stored into
//!   the stage by a kernel (`copy_out`: the stage's output half is mapped into the device's
//!   address space) rather than copied back by the copy engine, which with lookahead cost ~15 µs
//!   a step on an H100 (BENCHMARKS.md, session 30); the host waits on the event after that kernel,
//!   not on the stream (with lookahead the stream already holds the next step). Two stages
//!   alternate, so the next step can be staged while the last one is still in flight; a stage is
//!   reused only once the event of its last use fired.
//!
//! Device side of the outputs (`OUT_*`): one buffer `[stamps: 2 × u64][tokens: ns × i32]
//! [log-probs: ns × f32][top ids: ns × SAMPLE_MAX_TOP × i32][top log-probs: ns × SAMPLE_MAX_TOP
//! × f32]`, ns the step's sampled rows (padding included), so one copy brings back everything a
//! step returns. The top log-probabilities come last and are copied back only for a step with
//! rows that asked for them (`wants_top`): they are 20 times the rest.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent};

use crate::executor::cuda::device::Gpu;
use crate::executor::cuda::kernels::{self, CopyOutParams, SAMPLE_MAX_TOP};
use crate::step::{BatchInput, TopLogprobs};

/// Bytes before the sampled tokens in the output buffer: the two u64 timing stamps.
pub(super) const OUT_TOKENS: usize = 16;

/// Byte offset of the log-probabilities in the output buffer of a step with `ns` sampled rows.
pub(super) fn out_logprobs(ns: usize) -> usize {
    OUT_TOKENS + 4 * ns
}

/// Byte offset of the top ids (`[ns, SAMPLE_MAX_TOP]`, most likely first).
pub(super) fn out_top_ids(ns: usize) -> usize {
    OUT_TOKENS + 8 * ns
}

/// Byte offset of the top log-probabilities (`[ns, SAMPLE_MAX_TOP]`).
pub(super) fn out_top_logprobs(ns: usize) -> usize {
    out_top_ids(ns) + 4 * ns * SAMPLE_MAX_TOP
}

/// Bytes of the output buffer of a step with `ns` sampled rows; `top`: with the top
/// log-probabilities.
pub(super) fn out_bytes(ns: usize, top: bool) -> usize {
    match top {
        true => out_top_logprobs(ns) + 4 * ns * SAMPLE_MAX_TOP,
        false => out_top_ids(ns),
    }
}

/// Whether a sampled row of `batch` asked for top log-probabilities.
pub(super) fn wants_top(batch: &BatchInput) -> bool {
    batch.seqs.iter().any(|q| {
        q.sample
            .as_ref()
            .is_some_and(|s| s.params.logprobs > Some(0))
    })
}

/// Page-locked host memory of u32 words (`cuMemHostAlloc`), freed on drop.
struct Pinned {
    ptr: *mut u32,
    words: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the memory is owned by this value alone; the driver accepts it from any thread.
unsafe impl Send for Pinned {}

impl Pinned {
    fn alloc(ctx: &Arc<CudaContext>, words: usize, flags: u32) -> anyhow::Result<Self> {
        ctx.bind_to_thread()?;
        let words = words.max(2);
        // SAFETY: a fresh allocation, page-aligned (so aligned for u32 and u64).
        let ptr = unsafe { result::malloc_host(words * 4, flags) }? as *mut u32;
        anyhow::ensure!(!ptr.is_null(), "cuMemHostAlloc returned null");
        Ok(Pinned {
            ptr,
            words,
            ctx: ctx.clone(),
        })
    }

    /// Its device address (allocated with `CU_MEMHOSTALLOC_DEVICEMAP`).
    fn device_ptr(&self) -> anyhow::Result<u64> {
        self.ctx.bind_to_thread()?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live mapped allocation of this context.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, self.ptr as *mut _, 0) }.result()?;
        Ok(dptr)
    }

    fn slice(&self) -> &[u32] {
        // SAFETY: `words` initialised-or-not u32s that any bit pattern is valid for.
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }

    fn slice_mut(&mut self) -> &mut [u32] {
        // SAFETY: as `slice`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.words) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_host; no copy is pending (the owner waits for its stages).
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

struct Stage {
    meta: Pinned,
    /// Written by `copy_out` through `out_dev`, read by the host after `done`.
    out: Pinned,
    out_dev: u64,
    /// Recorded after the stage's copy back: the stage may be reused once it fired.
    done: CudaEvent,
}

/// The pinned staging of `CudaBackendOptions::pinned_io`: two stages used in turn.
pub(super) struct PinnedIo {
    stages: [Stage; 2],
    next: usize,
}

impl PinnedIo {
    /// Stages for up to `meta_words` words of metadata and `max_ns` sampled rows.
    pub fn new(gpu: &Gpu, meta_words: usize, max_ns: usize) -> anyhow::Result<Self> {
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let stage = || -> anyhow::Result<Stage> {
            // Read by the host: cached; written by a kernel: mapped.
            let out = Pinned::alloc(
                &gpu.ctx,
                out_bytes(max_ns, true).div_ceil(4),
                sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )?;
            Ok(Stage {
                // Written by the host in order, read only by the copy engine: write-combined.
                meta: Pinned::alloc(&gpu.ctx, meta_words, sys::CU_MEMHOSTALLOC_WRITECOMBINED)?,
                out_dev: out.device_ptr()?,
                out,
                done: gpu.ctx.new_event(Some(flags))?,
            })
        };
        Ok(PinnedIo {
            stages: [stage()?, stage()?],
            next: 0,
        })
    }

    /// The stage for the next launch, once the launch that used it last is done with it.
    pub fn take(&mut self) -> anyhow::Result<usize> {
        let k = self.next;
        self.next ^= 1;
        self.stages[k].done.synchronize()?;
        Ok(k)
    }

    /// Copies `meta` into stage `k` and enqueues its upload to `dst`.
    pub fn upload(&mut self, k: usize, gpu: &Gpu, dst: u64, meta: &[u32]) -> anyhow::Result<()> {
        let s = &mut self.stages[k].meta;
        anyhow::ensure!(
            meta.len() <= s.words,
            "{} metadata words for a stage of {}",
            meta.len(),
            s.words
        );
        s.slice_mut()[..meta.len()].copy_from_slice(meta);
        if !meta.is_empty() {
            // SAFETY: `dst` holds the step's metadata (sized for the largest step); the stage is
            // not written again before its event fires (`take`).
            unsafe {
                result::memcpy_htod_async(dst, &s.slice()[..meta.len()], gpu.stream.cu_stream())
            }?;
        }
        Ok(())
    }

    /// Enqueues the store of `bytes` of the output buffer at `src` into stage `k` (`copy_out`),
    /// then its event.
    pub fn download(&mut self, k: usize, gpu: &Gpu, src: u64, bytes: usize) -> anyhow::Result<()> {
        let st = &mut self.stages[k];
        let words = bytes.div_ceil(4);
        anyhow::ensure!(
            words <= st.out.words,
            "{bytes} output bytes for a stage of {} words",
            st.out.words
        );
        let p = CopyOutParams {
            src,
            dst: st.out_dev,
            words: words as i32,
        };
        // SAFETY: `src` holds the step's outputs (at least `words`), the stage as many; the host
        // reads the stage only after `wait`.
        unsafe { kernels::copy_out(gpu, &p) }?;
        st.done.record(&gpu.stream)?;
        Ok(())
    }

    /// Waits until stage `k`'s outputs have arrived, then returns them as words (the device
    /// output buffer's layout).
    pub fn wait(&self, k: usize) -> anyhow::Result<&[u32]> {
        self.stages[k].done.synchronize()?;
        Ok(self.stages[k].out.slice())
    }
}

impl Drop for PinnedIo {
    /// A step may still be copying into a stage (a lookahead step nobody waited for): its memory
    /// is freed only once the copy is done. Runs before the stages' fields are dropped.
    fn drop(&mut self) {
        for s in &self.stages {
            let _ = s.done.synchronize();
        }
    }
}

/// Reads a step's outputs from `words` (the output buffer's layout, `ns` rows of which the first
/// `tokens.len()` are wanted): tokens, log-probabilities, and the (start, end) stamps.
pub(super) fn read_outputs(
    words: &[u32],
    ns: usize,
    tokens: &mut [i32],
    logprobs: &mut [f32],
) -> (u64, u64) {
    let t0 = OUT_TOKENS / 4;
    let l0 = out_logprobs(ns) / 4;
    for (i, t) in tokens.iter_mut().enumerate() {
        *t = words[t0 + i] as i32;
    }
    for (i, l) in logprobs.iter_mut().enumerate() {
        *l = f32::from_bits(words[l0 + i]);
    }
    (
        words[0] as u64 | (words[1] as u64) << 32,
        words[2] as u64 | (words[3] as u64) << 32,
    )
}

/// Reads the top ids and log-probabilities of the first `ids.len() / SAMPLE_MAX_TOP` of `ns`
/// rows from `words` (a copy with the top section; `ids` empty: nothing to read).
pub(super) fn read_top(words: &[u32], ns: usize, ids: &mut [i32], logprobs: &mut [f32]) {
    let (i0, l0) = (out_top_ids(ns) / 4, out_top_logprobs(ns) / 4);
    for (i, t) in ids.iter_mut().enumerate() {
        *t = words[i0 + i] as i32;
    }
    for (i, l) in logprobs.iter_mut().enumerate() {
        *l = f32::from_bits(words[l0 + i]);
    }
}

/// The top log-probabilities of `batch`'s rows that asked for them (`params.logprobs`), in
/// sampled order, from `ids` and `logprobs` (`[sampled rows, SAMPLE_MAX_TOP]`, read by
/// `read_top`; empty when no row asked for more than its own); ids outside `vocab` dropped.
pub(super) fn collect_top(
    batch: &BatchInput,
    ids: &[i32],
    logprobs: &[f32],
    vocab: usize,
) -> Vec<TopLogprobs> {
    let mut tops = Vec::new();
    // A sequence with drafts has 1 + num_drafts rows (it never asks for log-probabilities).
    let mut next = 0;
    for q in batch.seqs.iter().filter(|q| q.sample.is_some()) {
        let i = next;
        next += 1 + q.num_drafts;
        let Some(k) = q.sample.as_ref().and_then(|s| s.params.logprobs) else {
            continue;
        };
        // k > 0 means wants_top, so the row's entries were read.
        let at = i * SAMPLE_MAX_TOP..i * SAMPLE_MAX_TOP + k.min(SAMPLE_MAX_TOP);
        let top = match k {
            0 => Vec::new(),
            _ => (ids[at.clone()].iter())
                .zip(&logprobs[at])
                .filter(|(&t, _)| t >= 0 && (t as usize) < vocab)
                .map(|(&t, &lp)| (t as u32, lp))
                .collect(),
        };
        tops.push(TopLogprobs {
            request_id: q.request_id,
            top,
        });
    }
    tops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_read_where_the_kernels_write_them() {
        // ns = 3 padded rows, 2 wanted.
        let ns = 3;
        let mut words = vec![0u32; out_bytes(ns, true) / 4];
        let (start, end) = (0x1_0000_0002u64, 0x3_0000_0004u64);
        words[0] = start as u32;
        words[1] = (start >> 32) as u32;
        words[2] = end as u32;
        words[3] = (end >> 32) as u32;
        for i in 0..ns {
            words[OUT_TOKENS / 4 + i] = 100 + i as u32;
            words[out_logprobs(ns) / 4 + i] = (-(i as f32) - 0.5).to_bits();
            for j in 0..SAMPLE_MAX_TOP {
                let k = i * SAMPLE_MAX_TOP + j;
                words[out_top_ids(ns) / 4 + k] = 1000 + k as u32;
                words[out_top_logprobs(ns) / 4 + k] = (-(k as f32)).to_bits();
            }
        }
        let (mut t, mut l) = (vec![0; 2], vec![0.0; 2]);
        assert_eq!(read_outputs(&words, ns, &mut t, &mut l), (start, end));
        assert_eq!(t, vec![100, 101]);
        assert_eq!(l, vec![-0.5, -1.5]);
        let (mut ids, mut lps) = (vec![0; 2 * SAMPLE_MAX_TOP], vec![0.0; 2 * SAMPLE_MAX_TOP]);
        read_top(&words, ns, &mut ids, &mut lps);
        assert_eq!((ids[0], ids[2 * SAMPLE_MAX_TOP - 1]), (1000, 1039));
        assert_eq!(lps[SAMPLE_MAX_TOP + 1], -21.0);
        // The sections tile the buffer; without the top section it ends after the log-probs.
        assert_eq!(out_top_ids(ns), out_logprobs(ns) + 4 * ns);
        assert_eq!(out_bytes(ns, false), out_top_ids(ns));
        assert_eq!(out_bytes(ns, true), words.len() * 4);
        // Every section stays 4-byte aligned; the stamps 8-byte.
        assert_eq!(OUT_TOKENS % 8, 0);
    }

    #[test]
    fn top_logprobs_go_to_the_rows_that_asked() {
        use crate::request::RequestId;
        use crate::sampling::params::SamplingParams;
        use crate::step::SampleInput;
        use std::sync::Arc;
        let sample = |logprobs| {
            Some(SampleInput {
                params: Arc::new(SamplingParams {
                    logprobs,
                    ..Default::default()
                }),
                seed: 0,
                output_index: 0,
            })
        };
        let mut b = BatchInput::default();
        b.push_seq(RequestId(1), &[1], 0, &[0], 16, sample(Some(2)));
        b.push_seq(RequestId(2), &[1, 2], 0, &[1], 16, None);
        b.push_seq(RequestId(3), &[1], 0, &[2], 16, sample(None));
        b.push_seq(RequestId(4), &[1], 0, &[3], 16, sample(Some(0)));
        b.push_seq(RequestId(5), &[1], 0, &[4], 16, sample(Some(3)));
        assert!(wants_top(&b));
        // Sampled rows 0, 1 (no logprobs), 2 (Some(0)), 3; an id outside the vocabulary dropped.
        let ids: Vec<i32> = (0..4 * SAMPLE_MAX_TOP as i32).collect();
        let mut ids = ids;
        ids[3 * SAMPLE_MAX_TOP + 1] = 5000;
        let lps: Vec<f32> = (0..4 * SAMPLE_MAX_TOP).map(|k| -(k as f32)).collect();
        let tops = collect_top(&b, &ids, &lps, 1000);
        let got: Vec<_> = tops
            .iter()
            .map(|t| (t.request_id.0, t.top.clone()))
            .collect();
        let r3 = 3 * SAMPLE_MAX_TOP;
        assert_eq!(
            got,
            vec![
                (1, vec![(0, 0.0), (1, -1.0)]),
                (4, vec![]),
                (
                    5,
                    vec![
                        (r3 as u32, -(r3 as f32)),
                        (r3 as u32 + 2, -(r3 as f32) - 2.0)
                    ]
                ),
            ]
        );
        let mut none = BatchInput::default();
        none.push_seq(RequestId(1), &[1], 0, &[0], 16, sample(Some(0)));
        assert!(!wants_top(&none));
    }
}
