//! The executor side of the KV memory tier: a backend holds the host tier's bytes and applies a
//! step's block copies (`SchedulerOutput::kv_copies`, `step::kv_copy`) before its forward.
//!
//! One interface, two memories: the CPU backend's host tier is plain memory (a second `KvPool`,
//! copies are memcpys in list order); the CUDA backend's is pinned host memory, copied on a
//! stream of its own (`executor::cuda::kv_tier`). Both keep one contract: a step's first
//! `kv_copies_for_forward` copies land before its forward, the rest may land while it runs and
//! must land before the next step's forward (`kv::manager::in_flight` plans them so the
//! forward never touches their blocks). CUDA overlaps them with the forward on events; the CPU
//! applies them at the start of the next step (`CpuHostTier::apply_step`), after the forward,
//! so a step that read one would compute from stale bytes here too and tests would see it.
//!
//! Every id is checked against its tier before anything is copied: a bad list is an error for
//! the step (a scheduler bug), never a copy out of bounds.

use std::time::Instant;

use anyhow::ensure;

use crate::model::llama::KvPool;
use crate::step::{BlockCopy, CopyKind};

/// What a backend with a host tier offers the engine.
pub trait KvTier {
    /// Blocks of the host tier (0: none).
    fn num_host_blocks(&self) -> usize;
    /// Applies `copies` in order; the next forward sees them all.
    fn apply_copies(&mut self, copies: &[BlockCopy]) -> anyhow::Result<()>;
    /// Copy bandwidth between the tiers, bytes per second one way (measured or configured).
    fn copy_bytes_per_s(&self) -> f64;
}

/// Checks every copy's ids against the tiers' sizes (`device`, `host` blocks).
pub fn check_copies(copies: &[BlockCopy], device: usize, host: usize) -> anyhow::Result<()> {
    for c in copies {
        let (src_n, dst_n) = match c.kind {
            CopyKind::DeviceToHost => (device, host),
            CopyKind::HostToDevice => (host, device),
            CopyKind::DeviceToDevice => (device, device),
        };
        ensure!(
            (c.src as usize) < src_n && (c.dst as usize) < dst_n,
            "block copy {c:?} outside the tiers ({device} device blocks, {host} host blocks)"
        );
        ensure!(
            c.kind != CopyKind::DeviceToDevice || c.src != c.dst,
            "block copy {c:?} onto itself"
        );
    }
    Ok(())
}

/// The CPU backend's host tier: a pool laid out as the device pool, in plain memory.
pub struct CpuHostTier {
    host: KvPool,
    bytes_per_s: f64,
    /// The last step's copies that ran "under" its forward: applied before anything else.
    pending: Vec<BlockCopy>,
}

impl CpuHostTier {
    /// `host` is an empty pool of the host tier's size; `bytes_per_s` the configured copy
    /// bandwidth, or None to measure it on `device` now.
    pub fn new(host: KvPool, device: &mut KvPool, bytes_per_s: Option<f64>) -> Self {
        let mut t = CpuHostTier {
            host,
            bytes_per_s: 0.0,
            pending: Vec::new(),
        };
        t.bytes_per_s = match bytes_per_s {
            Some(b) => b,
            None => t.measure(device),
        };
        t
    }

    pub fn num_blocks(&self) -> usize {
        self.host.num_blocks()
    }

    pub fn bytes_per_s(&self) -> f64 {
        self.bytes_per_s
    }

    /// A step's copies: the last step's pending ones, then the first `for_forward` now; the
    /// rest after the step's forward (at the next call: see the module doc). Every id is
    /// checked now, so a bad list fails its own step.
    pub fn apply_step(
        &mut self,
        device: &mut KvPool,
        copies: &[BlockCopy],
        for_forward: usize,
    ) -> anyhow::Result<()> {
        self.apply(device, &[])?;
        check_copies(copies, device.num_blocks(), self.host.num_blocks())?;
        let (needed, later) = copies.split_at(for_forward.min(copies.len()));
        self.apply_now(device, needed)?;
        self.pending = later.to_vec();
        Ok(())
    }

    /// Copies in order after any pending ones, each on the pools directly (a memcpy per layer,
    /// K and V).
    pub fn apply(&mut self, device: &mut KvPool, copies: &[BlockCopy]) -> anyhow::Result<()> {
        let pending = std::mem::take(&mut self.pending);
        self.apply_now(device, &pending)?;
        self.apply_now(device, copies)
    }

    fn apply_now(&mut self, device: &mut KvPool, copies: &[BlockCopy]) -> anyhow::Result<()> {
        check_copies(copies, device.num_blocks(), self.host.num_blocks())?;
        for c in copies {
            let (s, d) = (c.src as usize, c.dst as usize);
            match c.kind {
                CopyKind::DeviceToHost => KvPool::copy_block_between(device, s, &mut self.host, d),
                CopyKind::HostToDevice => KvPool::copy_block_between(&self.host, s, device, d),
                CopyKind::DeviceToDevice => device.copy_block_within(s, d),
            }
        }
        Ok(())
    }

    /// Copies with no host tier: copy-on-write within the device only (a host id is an error).
    pub fn apply_on_device(device: &mut KvPool, copies: &[BlockCopy]) -> anyhow::Result<()> {
        check_copies(copies, device.num_blocks(), 0)?;
        for c in copies {
            device.copy_block_within(c.src as usize, c.dst as usize);
        }
        Ok(())
    }

    pub fn host(&self) -> &KvPool {
        &self.host
    }

    /// Bytes per second of device → host block copies: a few round trips over up to 64 blocks
    /// (contents unchanged: the blocks come back to where they were).
    fn measure(&mut self, device: &mut KvPool) -> f64 {
        let n = device.num_blocks().min(self.host.num_blocks()).min(64);
        if n == 0 {
            return 0.0;
        }
        let block_bytes = device.block_data(0).len() * std::mem::size_of::<f32>();
        let start = Instant::now();
        let rounds = 4;
        for _ in 0..rounds {
            for b in 0..n {
                KvPool::copy_block_between(device, b, &mut self.host, b);
            }
        }
        let s = start.elapsed().as_secs_f64().max(1e-9);
        (rounds * n * block_bytes) as f64 / s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools(device: usize, host: usize) -> (KvPool, KvPool) {
        let cfg = crate::model::synthetic::synthetic_config("tiny").unwrap();
        (KvPool::new(&cfg, device, 4), KvPool::new(&cfg, host, 4))
    }

    fn random_block(pool: &KvPool, seed: u32) -> Vec<f32> {
        let n = pool.block_data(0).len();
        // Distinct bit patterns, negative zero and subnormals included, to catch any conversion.
        (0..n as u32)
            .map(|i| f32::from_bits((i.wrapping_mul(2_654_435_761) ^ seed) & 0xbfff_ffff))
            .collect()
    }

    #[test]
    fn blocks_round_trip_device_host_device_bit_exactly() {
        let (mut dev, host) = pools(6, 5);
        let mut t = CpuHostTier::new(host, &mut dev, Some(1e9));
        let a = random_block(&dev, 7);
        let b = random_block(&dev, 99);
        dev.set_block_data(2, &a);
        dev.set_block_data(3, &b);
        t.apply(
            &mut dev,
            &[BlockCopy::to_host(2, 4), BlockCopy::to_host(3, 0)],
        )
        .unwrap();
        // The device blocks are reused (poisoned), then the host copies come back elsewhere.
        dev.set_block_data(2, &vec![f32::NAN; a.len()]);
        dev.set_block_data(3, &vec![f32::NAN; a.len()]);
        t.apply(
            &mut dev,
            &[BlockCopy::to_device(4, 5), BlockCopy::to_device(0, 1)],
        )
        .unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(dev.block_data(5)), bits(a.clone()));
        assert_eq!(bits(dev.block_data(1)), bits(b));
        // Copy-on-write within the device leaves the source as it was.
        t.apply(&mut dev, &[BlockCopy::on_device(5, 0)]).unwrap();
        assert_eq!(bits(dev.block_data(0)), bits(a.clone()));
        assert_eq!(bits(dev.block_data(5)), bits(a));
    }

    #[test]
    fn copies_apply_in_list_order() {
        let (mut dev, host) = pools(3, 2);
        let mut t = CpuHostTier::new(host, &mut dev, Some(1e9));
        let a = random_block(&dev, 1);
        let b = random_block(&dev, 2);
        dev.set_block_data(0, &a);
        dev.set_block_data(1, &b);
        // Host block 0 is written with a, read back into device 2, then overwritten with b.
        t.apply(
            &mut dev,
            &[
                BlockCopy::to_host(0, 0),
                BlockCopy::to_device(0, 2),
                BlockCopy::to_host(1, 0),
            ],
        )
        .unwrap();
        assert_eq!(dev.block_data(2), a);
        assert_eq!(t.host().block_data(0), b);
    }

    #[test]
    fn copies_past_for_forward_land_at_the_next_step() {
        let (mut dev, host) = pools(4, 2);
        let mut t = CpuHostTier::new(host, &mut dev, Some(1e9));
        let (a, b) = (random_block(&dev, 4), random_block(&dev, 5));
        dev.set_block_data(0, &a);
        dev.set_block_data(1, &b);
        // Copy-on-write 0 → 2 before the forward; the swap-out of 1 under it.
        let copies = [BlockCopy::on_device(0, 2), BlockCopy::to_host(1, 0)];
        t.apply_step(&mut dev, &copies, 1).unwrap();
        assert_eq!(dev.block_data(2), a);
        assert!(t.host().block_data(0).iter().all(|x| x.is_nan()), "not yet");
        t.apply_step(&mut dev, &[], 0).unwrap();
        assert_eq!(t.host().block_data(0), b);
        // A bad id fails its own step, and nothing of it is applied.
        let bad = [BlockCopy::to_host(1, 1), BlockCopy::to_host(0, 9)];
        assert!(t.apply_step(&mut dev, &bad, 0).is_err());
        t.apply_step(&mut dev, &[], 0).unwrap();
        assert!(t.host().block_data(1).iter().all(|x| x.is_nan()));
    }

    #[test]
    fn bad_ids_are_an_error_and_copy_nothing() {
        let (mut dev, host) = pools(3, 2);
        let mut t = CpuHostTier::new(host, &mut dev, None);
        assert!(t.bytes_per_s() > 0.0, "measured");
        let a = random_block(&dev, 3);
        dev.set_block_data(0, &a);
        for bad in [
            vec![BlockCopy::to_host(0, 1), BlockCopy::to_host(0, 2)],
            vec![BlockCopy::to_device(2, 0)],
            vec![BlockCopy::to_device(0, 3)],
            vec![BlockCopy::on_device(1, 1)],
        ] {
            let e = t.apply(&mut dev, &bad).unwrap_err().to_string();
            assert!(e.contains("block copy"), "{e}");
        }
        assert_eq!(dev.block_data(0), a);
        assert!(
            t.host().block_data(1).iter().all(|x| x.is_nan()),
            "untouched"
        );
    }
}
