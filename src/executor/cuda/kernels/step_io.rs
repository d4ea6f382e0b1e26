//! The kernels of the step pipeline (`stamp` for step timing, `feed_tokens` for lookahead
//! decode, `copy_out` for pinned I/O) and the decode split rule that fills the GPU at batch 1
//! (`decode_splits_filled`).

use super::{decode_group_ctas, Gpu};

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StampParams {
    /// `[2]` u64: (start, end) of a step in the GPU's global timer, ns.
    pub stamps: u64,
    pub slot: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FeedTokensParams {
    pub sampled: u64,
    pub tokens: u64,
    pub n: i32,
    pub vocab: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CopyOutParams {
    /// `[words]` u32, device memory.
    pub src: u64,
    /// `[words]` u32: page-locked host memory, by its device address.
    pub dst: u64,
    pub words: i32,
}

/// # Safety
/// `p.src` and `p.dst` address `p.words` live u32 each, `p.dst` mapped host memory.
pub unsafe fn copy_out(gpu: &Gpu, p: &CopyOutParams) -> anyhow::Result<()> {
    launch_per_element(gpu, "copy_out", p.words, p)
}

/// `name`, a kernel of one thread an element in blocks of 256, over `n` elements (none: no
/// launch).
///
/// # Safety
/// As the kernel's own launcher.
unsafe fn launch_per_element<P: Copy>(gpu: &Gpu, name: &str, n: i32, p: &P) -> anyhow::Result<()> {
    if n <= 0 {
        return Ok(());
    }
    gpu.launch(name, ((n as u32).div_ceil(256), 1, 1), (256, 1, 1), p)
}

/// # Safety
/// `p.stamps` addresses two live u64 and `p.slot` is 0 or 1.
pub unsafe fn stamp(gpu: &Gpu, p: &StampParams) -> anyhow::Result<()> {
    anyhow::ensure!((0..2).contains(&p.slot), "stamp slot {}", p.slot);
    gpu.launch("stamp", (1, 1, 1), (1, 1, 1), p)
}

/// # Safety
/// Every pointer in `p` addresses a live device buffer of the shape given in feed_tokens.cu.
pub unsafe fn feed_tokens(gpu: &Gpu, p: &FeedTokensParams) -> anyhow::Result<()> {
    launch_per_element(gpu, "feed_tokens", p.n, p)
}

/// Most splits of `decode_splits_filled`.
pub const MAX_FILLED_SPLITS: usize = 64;

/// Splits per (item, kv head slice) so that the decode grid holds about `ctas_per_sm` CTAs per
/// SM (`CudaBackendOptions::decode_ctas_per_sm`), with at least `min_keys` keys per split
/// (`kernels::decode_min_split_keys`), rounded down to a power of two so that a batch bucket
/// needs few CUDA graphs (one per split count) as its context grows. At batch 1 a decode is
/// short of parallelism: Llama-2-7B's 32 kv heads give 32 CTAs, a quarter of the H200's 132
/// SMs, so the keys are cut in up to 64 splits; at batch ≥ 32 there is one split.
pub fn decode_splits_filled(
    num_sms: u32,
    ctas_per_sm: usize,
    num_items: usize,
    num_kv_heads: usize,
    group: usize,
    max_context: usize,
    min_keys: usize,
) -> usize {
    let ctas = (num_items * num_kv_heads * decode_group_ctas(group.max(1))).max(1);
    let want = (ctas_per_sm.max(1) * num_sms as usize).div_ceil(ctas);
    let splits = want
        .min(max_context.div_ceil(min_keys.max(1)))
        .clamp(1, MAX_FILLED_SPLITS);
    1 << splits.ilog2()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_splits_cover_the_sms_in_powers_of_two() {
        // Llama-2-7B at batch 1 on 132 SMs: 4 CTAs a SM want 17 splits of 32 heads -> 16.
        assert_eq!(decode_splits_filled(132, 4, 1, 32, 1, 4096, 32), 16);
        assert_eq!(decode_splits_filled(132, 8, 1, 32, 1, 16384, 32), 32);
        // Llama-3-8B (8 kv heads, group 4): 66 wanted, capped at 64.
        assert_eq!(decode_splits_filled(132, 4, 1, 8, 4, 4096, 32), 64);
        // Short contexts: at least `min_keys` a split (100 keys -> 4, then 2 at 64 keys; with
        // 128 keys a split, Llama-3-8B at 4k takes 32 splits instead of 64).
        assert_eq!(decode_splits_filled(132, 4, 1, 32, 1, 100, 32), 4);
        assert_eq!(decode_splits_filled(132, 4, 1, 32, 1, 64, 32), 2);
        assert_eq!(decode_splits_filled(132, 4, 1, 32, 1, 1, 32), 1);
        assert_eq!(decode_splits_filled(132, 4, 1, 8, 4, 4096, 128), 32);
        assert_eq!(decode_splits_filled(132, 4, 1, 8, 4, 100, 128), 1);
        // Enough CTAs without splitting.
        assert_eq!(decode_splits_filled(132, 4, 32, 32, 1, 16384, 32), 1);
        // Groups over 8 take two CTAs per kv head.
        assert_eq!(
            decode_splits_filled(132, 4, 1, 2, 16, 1 << 20, 32),
            decode_splits_filled(132, 4, 1, 4, 8, 1 << 20, 32)
        );
        for items in 1..600 {
            let s = decode_splits_filled(132, 4, items, 8, 4, 1 << 20, 32);
            assert!(
                s.is_power_of_two() && s <= MAX_FILLED_SPLITS,
                "{items}: {s}"
            );
        }
    }
}
