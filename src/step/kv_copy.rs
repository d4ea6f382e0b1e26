//! Block copies between the KV memory tiers, planned by the KV manager and carried by a step.
//!
//! Two tiers: the device tier (the executor's paged pool, whose block ids the block tables
//! hold) and the host tier (CPU RAM; pinned on CUDA). A step's copies form one ordered list,
//! applied before the step's forward in list order, on a copy stream of their own on CUDA:
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
}
