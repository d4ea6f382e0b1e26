//! Copies that run under the forward: the KV manager's half of overlapping block copies with
//! compute (the backend's half: `executor::kv_tier`).
//!
//! A step's copies run on the backend's copy stream. The forward of the step waits only for
//! the leading copies it needs (`Mem::for_forward`: eviction write-backs, whose device blocks
//! are handed out at once and written by this very forward, and copy-on-write); every later
//! copy runs while the forward computes, and the next step's forward waits for them all (on
//! the device, an event: no host sync). So a copy that overlaps the forward must touch no
//! device block the forward reads or writes. Two rules here make that so:
//! - its device block (a swap-out's source, a copy back's destination) is held by one extra
//!   reference (`fenced`) until the step's copies are taken: no allocation of the same step can
//!   hand it out, evict it or write it, even when its request is preempted or cancelled in
//!   that step; it returns to the free list only for later steps, whose forwards wait. Fenced
//!   blocks still count as free for the step's allocations (preemption frees blocks for the
//!   very step that preempts): an allocation the free list alone cannot serve ends the fences
//!   (`make_free`), and the forward then waits for every copy planned so far — correct
//!   always, overlapped whenever the step does not need the blocks at once;
//! - a block a copy fills is registered in the prefix cache (`pending_cache`) only when the
//!   step's copies are taken: no request admitted in the same step finds it and reads it in
//!   this forward, before its bytes have landed.
//!
//! Host blocks need no rule: only copies touch them, on one stream, in list order.

use super::Mem;
use crate::kv::block_pool::{BlockHash, BlockId};
use crate::step::{BlockCopy, CopyKind};

/// The in-flight state of the step being planned (see the module doc).
#[derive(Debug, Default)]
pub(super) struct InFlight {
    /// Device blocks of overlapped copies, each holding one reference until `take_copies`.
    fenced: Vec<BlockId>,
    /// Blocks overlapped copies fill, with their hashes, registered at `take_copies`.
    pending_cache: Vec<(BlockId, BlockHash)>,
    /// Leading copies of the list this step's forward waits for.
    for_forward: usize,
}

impl Mem {
    /// Plans a copy this step's forward needs landed before it runs (it writes or reads the
    /// copy's device block); so does every copy before it in the list.
    pub(super) fn copy(&mut self, c: BlockCopy) {
        self.count(c);
        self.copies.push(c);
        self.in_flight.for_forward = self.copies.len();
    }

    /// Plans a copy that runs under this step's forward: its device block is fenced off (see
    /// the module doc). A copy back's block is registered under `hash` once the step is built.
    pub(super) fn copy_overlapped(&mut self, c: BlockCopy, hash: Option<BlockHash>) {
        let b = match c.kind {
            CopyKind::DeviceToHost => c.src,
            CopyKind::HostToDevice => c.dst,
            CopyKind::DeviceToDevice => unreachable!("copy-on-write is read by its step"),
        };
        self.count(c);
        self.copies.push(c);
        self.device.touch(b);
        self.in_flight.fenced.push(b);
        if let Some(h) = hash {
            self.in_flight.pending_cache.push((b, h));
        }
    }

    /// Whether no request holds device block `b` (free, or held by fences alone): taking it
    /// for a table costs a free block.
    pub(super) fn unheld(&self, b: BlockId) -> bool {
        let fences = self.in_flight.fenced.iter().filter(|&&f| f == b).count();
        self.device.ref_count(b) as usize == fences
    }

    /// Blocks an allocation can take now: free ones, and fenced ones that only fences hold
    /// (taking those makes the forward wait for their copies: `make_free`).
    pub(super) fn num_free(&self) -> usize {
        let mut held: Vec<BlockId> = self.in_flight.fenced.clone();
        held.sort_unstable();
        held.dedup();
        self.device.num_free() + held.into_iter().filter(|&b| self.unheld(b)).count()
    }

    /// Whether `n` blocks can be allocated now. When the free list alone is short but fenced
    /// blocks would cover it, the fences end: every copy planned so far becomes one this
    /// step's forward waits for (a fenced block may now be handed out and written by it), and
    /// the blocks filled are registered at once (their copies land before the forward).
    pub(super) fn make_free(&mut self, n: usize) -> bool {
        if n <= self.device.num_free() {
            return true;
        }
        if n > self.num_free() {
            return false;
        }
        let f = std::mem::take(&mut self.in_flight);
        for (b, h) in f.pending_cache {
            self.device.cache(b, h);
        }
        for &b in f.fenced.iter().rev() {
            self.device.release(b);
        }
        self.in_flight.for_forward = self.copies.len();
        debug_assert!(n <= self.device.num_free());
        true
    }

    fn count(&mut self, c: BlockCopy) {
        match c.kind {
            CopyKind::DeviceToHost => self.stats.swap_out_blocks += 1,
            CopyKind::HostToDevice => self.stats.swap_in_blocks += 1,
            CopyKind::DeviceToDevice => self.stats.cow_blocks += 1,
        }
    }

    /// The step's copies and how many of them its forward waits for; the fenced blocks are
    /// released and the filled ones registered (later steps' forwards wait for every copy).
    pub(super) fn take_copies(&mut self) -> (Vec<BlockCopy>, usize) {
        let f = std::mem::take(&mut self.in_flight);
        for (b, h) in f.pending_cache {
            self.device.cache(b, h);
        }
        for &b in f.fenced.iter().rev() {
            self.device.release(b);
        }
        (std::mem::take(&mut self.copies), f.for_forward)
    }

    /// Drops the planned copies (the backend they were for is gone); `keep_pool`: the device
    /// pool stays, so the fences' references are released (else the pool is replaced).
    pub(super) fn drop_planned(&mut self, keep_pool: bool) {
        let f = std::mem::take(&mut self.in_flight);
        if keep_pool {
            for &b in f.fenced.iter().rev() {
                self.device.release(b);
            }
        }
        self.copies.clear();
    }

    /// Blocks fenced off now, one entry per reference held (invariant checks).
    #[cfg(test)]
    pub(super) fn fenced(&self) -> &[BlockId] {
        &self.in_flight.fenced
    }
}

#[cfg(test)]
mod tests {
    use super::super::KvCacheManager;
    use crate::request::RequestId;
    use crate::step::CopyKind;

    const BS: usize = 4;

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed * 1000 + i).collect()
    }

    /// A request holding `blocks` full blocks of its own, registered as a finished step would.
    fn hold(kv: &mut KvCacheManager, req: u64, blocks: usize) -> Vec<u32> {
        let (id, t) = (RequestId(req), toks(req as u32, blocks * BS));
        kv.allocate_slots(id, 0, t.len()).unwrap();
        kv.take_copies();
        kv.cache_computed_blocks(id, &t, t.len());
        kv.block_table(id).to_vec()
    }

    #[test]
    fn swapped_out_blocks_are_not_handed_out_in_the_same_step() {
        let mut kv = KvCacheManager::new(8, BS, true).with_host_tier(8);
        let a = hold(&mut kv, 1, 3);
        assert!(kv.swap_out(RequestId(1)));
        // Five blocks are free without touching a's: they serve this step, a's stay fenced.
        kv.allocate_slots(RequestId(2), 0, 5 * BS).unwrap();
        let b = kv.block_table(RequestId(2)).to_vec();
        assert!(b.iter().all(|x| !a.contains(x)), "{a:?} {b:?}");
        let (copies, for_forward) = kv.take_step_copies();
        assert_eq!(copies.len(), 3);
        assert!(copies.iter().all(|c| c.kind == CopyKind::DeviceToHost));
        assert_eq!(for_forward, 0, "the swap-out runs under the forward");
        kv.check_invariants().unwrap();
        // The next step may take them: its forward waits for the copies first.
        assert_eq!(kv.num_free_blocks(), 3);
        kv.allocate_slots(RequestId(3), 0, 3 * BS).unwrap();
        assert_eq!(kv.take_step_copies(), (Vec::new(), 0));
        kv.check_invariants().unwrap();
    }

    #[test]
    fn taking_fenced_blocks_makes_the_forward_wait_for_their_copies() {
        let mut kv = KvCacheManager::new(4, BS, true).with_host_tier(8);
        hold(&mut kv, 1, 3);
        assert_eq!(kv.num_free_blocks(), 1);
        assert!(kv.swap_out(RequestId(1)));
        // Preemption frees blocks for the very step that preempts: they still count as free,
        // and taking them ends the fences.
        assert_eq!(kv.num_free_blocks(), 4);
        kv.allocate_slots(RequestId(2), 0, 4 * BS).unwrap();
        let (copies, for_forward) = kv.take_step_copies();
        assert_eq!(
            (copies.len(), for_forward),
            (3, 3),
            "all before the forward"
        );
        kv.check_invariants().unwrap();
    }

    #[test]
    fn blocks_coming_back_are_found_by_lookups_only_from_the_next_step() {
        let mut kv = KvCacheManager::new(8, BS, true).with_host_tier(8);
        let t = toks(1, 3 * BS);
        hold(&mut kv, 1, 3);
        assert!(kv.swap_out(RequestId(1)));
        kv.take_copies();
        // Another prompt evicts a's cached device blocks (they are written back already).
        kv.allocate_slots(RequestId(5), 0, 8 * BS).unwrap();
        kv.take_copies();
        kv.free(RequestId(5));
        assert!(kv.swap_in(RequestId(1)));
        // Same step: a request with a's prompt finds nothing on the device (the bytes are in
        // flight); the loading request's copies run under the forward.
        let mut probe = t.clone();
        probe.push(7);
        assert_eq!(kv.get_computed_blocks(RequestId(2), &probe), 3 * BS);
        assert_eq!(kv.num_host_hit_blocks(RequestId(2)), 3, "host hits only");
        let (copies, for_forward) = kv.take_step_copies();
        assert!(copies.iter().all(|c| c.kind == CopyKind::HostToDevice));
        assert_eq!((copies.len(), for_forward), (3, 0));
        // Next step: they are device hits.
        assert_eq!(kv.get_computed_blocks(RequestId(3), &probe), 3 * BS);
        assert_eq!(kv.num_host_hit_blocks(RequestId(3)), 0);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn cancel_during_a_swap_leaks_nothing_and_hands_out_nothing_in_flight() {
        // No prefix caching: every swapped block is copied both ways.
        let mut kv = KvCacheManager::new(8, BS, false).with_host_tier(8);
        hold(&mut kv, 1, 3);
        hold(&mut kv, 2, 2);
        // 1 is swapped out, and cancelled in the same step; 2 is swapped out and back in
        // (copies planned), then cancelled in the same step.
        assert!(kv.swap_out(RequestId(1)));
        kv.free(RequestId(1));
        assert!(kv.swap_out(RequestId(2)));
        kv.take_copies();
        assert!(kv.swap_in(RequestId(2)));
        let back = kv.block_table(RequestId(2)).to_vec();
        kv.free(RequestId(2));
        // Its blocks are fenced until the step is built: another request takes every other
        // block, none of them, and the copies still run under the forward.
        assert_eq!(back.len(), 2);
        kv.allocate_slots(RequestId(3), 0, 6 * BS).unwrap();
        let c = kv.block_table(RequestId(3));
        assert!(c.iter().all(|b| !back.contains(b)), "{back:?} {c:?}");
        kv.check_invariants().unwrap();
        let (copies, for_forward) = kv.take_step_copies();
        assert_eq!((copies.len(), for_forward), (2, 0));
        kv.free(RequestId(3));
        assert_eq!(kv.usage().used_blocks, 0);
        assert_eq!(kv.host_usage().unwrap().used_blocks, 0);
        assert_eq!(kv.num_free_blocks(), 8);
        kv.check_invariants().unwrap();
    }
}
