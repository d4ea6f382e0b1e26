//! Block copies between the KV memory tiers, planned by the KV manager and carried by a step.
//!
//! Two tiers: the device tier (the executor's paged pool, whose block ids the block tables
//! hold) and the host tier (CPU RAM; pinned on CUDA). A step's copies form one ordered list,
//! applied in list order, on a copy stream of their own on CUDA; the first
//! `SchedulerOutput::kv_copies_for_forward` land before the step's forward, the rest may run
//! under it and land before the next step's (`kv::manager::in_flight`):
//! - `DeviceToHost`: a block leaves the device (an evicted prefix block written back, a
//!   preempted request swapped out);
//! - `HostToDevice`: a block comes back (a host-tier prefix hit, a swapped request resuming);
//! - `DeviceToDevice`: copy-on-write of a block shared by forked sequences (`n > 1`).
//!
//! The list is in the order the KV manager decided them, so applying it in order is always
//! right: a block written back before its device slot was reused is read before it is
//! overwritten, a host block read by a swap-in before a later write-back reuses it. A backend
//! that overlaps the copies with compute must still never let a forward read a block a pending
//! copy writes, nor write a block a pending copy reads (`executor::kv_tier`).

/// Which way one block copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyKind {
    DeviceToHost,
    HostToDevice,
    DeviceToDevice,
}

/// One block copy: `src` and `dst` are block ids in the tiers `kind` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockCopy {
    pub kind: CopyKind,
    pub src: u32,
    pub dst: u32,
}

impl BlockCopy {
    pub fn to_host(device: u32, host: u32) -> Self {
        BlockCopy {
            kind: CopyKind::DeviceToHost,
            src: device,
            dst: host,
        }
    }

    pub fn to_device(host: u32, device: u32) -> Self {
        BlockCopy {
            kind: CopyKind::HostToDevice,
            src: host,
            dst: device,
        }
    }

    pub fn on_device(src: u32, dst: u32) -> Self {
        BlockCopy {
            kind: CopyKind::DeviceToDevice,
            src,
            dst,
        }
    }

    /// The device block this copy writes, if any.
    pub fn device_written(&self) -> Option<u32> {
        match self.kind {
            CopyKind::DeviceToHost => None,
            CopyKind::HostToDevice | CopyKind::DeviceToDevice => Some(self.dst),
        }
    }

    /// The device block this copy reads, if any.
    pub fn device_read(&self) -> Option<u32> {
        match self.kind {
            CopyKind::HostToDevice => None,
            CopyKind::DeviceToHost | CopyKind::DeviceToDevice => Some(self.src),
        }
    }
}

/// Maximal runs of consecutive copies of one kind whose sources and destinations are both
/// consecutive ids: `(first copy, blocks)`. A backend copies each run as one range, so a batch
/// of copies costs one transfer per run, not per block.
pub fn runs(copies: &[BlockCopy]) -> impl Iterator<Item = (BlockCopy, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = *copies.get(i)?;
        let mut n = 1;
        while let Some(c) = copies.get(i + n) {
            let k = n as u32;
            if c.kind != first.kind
                || c.src != first.src.wrapping_add(k)
                || c.dst != first.dst.wrapping_add(k)
            {
                break;
            }
            n += 1;
        }
        i += n;
        Some((first, n))
    })
}

/// Splits `copies` into consecutive segments within which no copy touches a block (in its
/// tier) that an earlier copy of the segment writes, nor writes one an earlier copy reads: the
/// copies of one segment may run in any order, so a backend batches each segment by kind (one
/// gather and one large transfer per direction) and still applies the list as if in order.
/// Returns the segments' ends (exclusive), the last one `copies.len()`.
pub fn segments(copies: &[BlockCopy]) -> Vec<usize> {
    use std::collections::HashSet;
    // (tier is the device, block) read / written within the current segment.
    let (mut read, mut written) = (HashSet::new(), HashSet::new());
    let mut ends = Vec::new();
    for (i, c) in copies.iter().enumerate() {
        let src = (c.kind != CopyKind::HostToDevice, c.src);
        let dst = (c.kind != CopyKind::DeviceToHost, c.dst);
        if written.contains(&src) || written.contains(&dst) || read.contains(&dst) {
            ends.push(i);
            read.clear();
            written.clear();
        }
        read.insert(src);
        written.insert(dst);
    }
    if !copies.is_empty() {
        ends.push(copies.len());
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_only_consecutive_ids_of_one_kind_in_order() {
        let c = [
            BlockCopy::to_host(4, 10),
            BlockCopy::to_host(5, 11),
            BlockCopy::to_host(6, 13),
            BlockCopy::to_device(14, 6),
            BlockCopy::to_device(15, 7),
            BlockCopy::on_device(7, 8),
        ];
        let got: Vec<_> = runs(&c).collect();
        assert_eq!(
            got,
            vec![(c[0], 2), (c[2], 1), (c[3], 2), (c[5], 1)],
            "order kept, kinds never merged"
        );
        assert_eq!(runs(&[]).count(), 0);
        assert_eq!(c[0].device_read(), Some(4));
        assert_eq!(c[0].device_written(), None);
        assert_eq!(c[3].device_written(), Some(6));
        assert_eq!(c[5].device_read(), Some(7));
        assert_eq!(c[5].device_written(), Some(8));
    }

    #[test]
    fn segments_break_only_where_order_matters() {
        use BlockCopy as B;
        assert!(segments(&[]).is_empty());
        // Independent copies of all kinds: one segment.
        let free = [
            B::to_host(1, 1),
            B::to_device(2, 3),
            B::on_device(4, 5),
            B::to_host(6, 7),
        ];
        assert_eq!(segments(&free), vec![4]);
        // Read after write (device 3 written, then read out), write after read (host 7 read
        // back, then overwritten), write after write (device 9 twice): a new segment each.
        let raw = [B::to_device(0, 3), B::to_host(3, 4)];
        assert_eq!(segments(&raw), vec![1, 2]);
        let war = [B::to_device(7, 2), B::to_host(5, 7), B::to_host(6, 8)];
        assert_eq!(segments(&war), vec![1, 3]);
        let waw = [B::on_device(1, 9), B::to_device(0, 9)];
        assert_eq!(segments(&waw), vec![1, 2]);
        // An eviction write-back of device 4 then a copy back into it, as allocation plans.
        let evict = [B::to_host(4, 0), B::to_host(8, 1), B::to_device(5, 4)];
        assert_eq!(segments(&evict), vec![2, 3]);
        // Ids alike in the other tier do not conflict: host 3 vs device 3.
        assert_eq!(segments(&[B::to_host(3, 0), B::to_device(3, 1)]), vec![2]);
        // Reads never conflict with reads.
        assert_eq!(segments(&[B::to_host(2, 0), B::on_device(2, 6)]), vec![2]);
    }

    /// Applying each segment's copies in reverse gives what applying the list in order gives.
    #[test]
    fn any_order_within_a_segment_matches_list_order() {
        use rand::{Rng, SeedableRng};
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let apply =
            |copies: &mut dyn Iterator<Item = BlockCopy>, dev: &mut [u32], host: &mut [u32]| {
                for c in copies {
                    let v = match c.kind {
                        CopyKind::HostToDevice => host[c.src as usize],
                        _ => dev[c.src as usize],
                    };
                    match c.kind {
                        CopyKind::DeviceToHost => host[c.dst as usize] = v,
                        _ => dev[c.dst as usize] = v,
                    }
                }
            };
        for _ in 0..300 {
            let copies: Vec<BlockCopy> = (0..r.random_range(0..12))
                .map(|_| {
                    let (a, b) = (r.random_range(0..6), r.random_range(0..6));
                    match r.random_range(0..3) {
                        0 => BlockCopy::to_host(a, b),
                        1 => BlockCopy::to_device(a, b),
                        _ => BlockCopy::on_device(a, (a + 1 + b % 5) % 6),
                    }
                })
                .collect();
            let init = |k: u32| (0..6).map(|i| i + k).collect::<Vec<u32>>();
            let (mut d1, mut h1) = (init(0), init(100));
            apply(&mut copies.iter().copied(), &mut d1, &mut h1);
            let (mut d2, mut h2) = (init(0), init(100));
            let mut start = 0;
            for end in segments(&copies) {
                apply(
                    &mut copies[start..end].iter().rev().copied(),
                    &mut d2,
                    &mut h2,
                );
                start = end;
            }
            assert_eq!((d1, h1), (d2, h2), "{copies:?}");
        }
    }
}
