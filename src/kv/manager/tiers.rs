//! The host tier of the KV manager: a second `BlockPool` whose blocks live in CPU memory (the
//! executor holds their bytes; pinned on CUDA).
//!
//! Host blocks hold two kinds of content, with the device pool's rules:
//! - prefix blocks: a cached device block evicted by allocation is written back here under its
//!   hash (`offload`), unless the host holds that hash already. Unreferenced, they sit in the
//!   host pool's LRU free list and stay findable until host allocation evicts them; a prefix
//!   lookup that finds one brings it back (`allocate_slots`);
//! - swapped requests: `swap_out` moves a preempted request's whole table here (its cached
//!   blocks under their hashes, shared with any other holder; the rest private), referenced
//!   until `swap_in` brings it back or `free` drops it.
//!
//! Every copy goes into the manager's ordered list; its order is the order of the decisions,
//! so a block is always read by an earlier copy before a later one overwrites it.

use std::collections::HashMap;

use super::{KvCacheManager, KvUsage, Mem, ReqBlocks};
use crate::kv::block_pool::{BlockHash, BlockId, BlockPool};
use crate::request::RequestId;
use crate::step::{BlockCopy, NULL_BLOCK};

/// Copies and swaps since start: the tier metrics follow these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierStats {
    /// Blocks copied device → host (write-backs and swap-outs).
    pub swap_out_blocks: u64,
    /// Blocks copied host → device (host prefix hits and swap-ins).
    pub swap_in_blocks: u64,
    /// Blocks copied within the device (copy-on-write of forked sequences).
    pub cow_blocks: u64,
    /// Cached device blocks evicted and written back to the host tier (part of
    /// `swap_out_blocks`).
    pub offloaded_blocks: u64,
    /// Requests swapped out whole, and back in.
    pub swapped_out_requests: u64,
    pub swapped_in_requests: u64,
}

/// A swapped-out request: its table as host blocks, and what its device entry held.
#[derive(Debug)]
struct Swapped {
    /// Per table entry: the host block holding it, or `NULL_BLOCK` (freed behind the window).
    entries: Vec<BlockId>,
    /// Per entry: the hash it was cached under on the device, if it was.
    hashes: Vec<Option<BlockHash>>,
    /// The device entry's own state, restored on `swap_in`.
    table_hashes: Vec<BlockHash>,
    num_cached_blocks: usize,
    num_freed: usize,
}

#[derive(Debug)]
pub(super) struct HostTier {
    pool: BlockPool,
    swapped: HashMap<RequestId, Swapped>,
}

impl HostTier {
    pub(super) fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.pool.lookup(hash)
    }

    /// Takes (`pin`) or drops a reference to a host block, so that nothing evicts it meanwhile.
    pub(super) fn pin(&mut self, block: BlockId, pin: bool) {
        if pin {
            self.pool.touch(block);
        } else {
            self.pool.release(block);
        }
    }

    /// A cached device block is being evicted: its copy into a host block (evicting the
    /// host's least recently used prefix block), registered under its hash. None when the
    /// host holds that prefix already, or every host block is held by swapped requests.
    pub(super) fn offload(&mut self, device: BlockId, hash: BlockHash) -> Option<BlockCopy> {
        if self.pool.lookup(hash).is_some() {
            return None;
        }
        let mut out = Vec::with_capacity(1);
        if !self.pool.allocate(1, &mut out) {
            return None;
        }
        let host = out[0];
        self.pool.cache(host, hash);
        self.pool.release(host);
        Some(BlockCopy::to_host(device, host))
    }

    /// Unregisters every cached host block (the backend's host memory was rebuilt); none may
    /// be held by a swapped request. Returns how many were registered.
    pub(super) fn forget_cached(&mut self) -> usize {
        assert!(
            self.swapped.is_empty(),
            "forgetting the host tier while requests are swapped out to it"
        );
        self.pool.forget_cached()
    }

    /// Drops a swapped request's host blocks (cancelled or aborted while swapped out).
    pub(super) fn free_swapped(&mut self, req: RequestId) {
        if let Some(s) = self.swapped.remove(&req) {
            for &b in s.entries.iter().rev().filter(|&&b| b != NULL_BLOCK) {
                self.pool.release(b);
            }
        }
    }

    #[cfg(test)]
    pub(super) fn swapped_ids(&self) -> impl Iterator<Item = &RequestId> {
        self.swapped.keys()
    }

    /// Pool invariants, and every host block's reference count equals the swapped entries
    /// holding it.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut refs = vec![0u32; self.pool.num_blocks()];
        for s in self.swapped.values() {
            for &b in s.entries.iter().filter(|&&b| b != NULL_BLOCK) {
                refs[b as usize] += 1;
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            if self.pool.ref_count(b as BlockId) != r {
                return Err(format!(
                    "host block {b}: ref count {} but {r} swapped entries",
                    self.pool.ref_count(b as BlockId)
                ));
            }
        }
        Ok(())
    }
}

impl KvCacheManager {
    /// Adds a host tier of `num_blocks` blocks (0: none). Evicted prefix blocks go there, and
    /// preempted requests can be swapped out to it.
    pub fn with_host_tier(mut self, num_blocks: usize) -> Self {
        self.resize_host_tier(num_blocks);
        self
    }

    /// A new host tier of `num_blocks` (the backend was rebuilt with another size; 0: none).
    /// No request may be swapped out; planned copies are dropped with the old tier.
    pub fn resize_host_tier(&mut self, num_blocks: usize) {
        assert!(
            self.mem.host.as_ref().is_none_or(|h| h.swapped.is_empty()),
            "resizing the host tier while requests are swapped out to it"
        );
        self.mem.drop_planned(true);
        self.mem.host = (num_blocks > 0).then(|| HostTier {
            pool: BlockPool::new(num_blocks),
            swapped: HashMap::new(),
        });
        if self.mem.host.is_some() {
            let device = std::mem::replace(&mut self.mem.device, BlockPool::new(0));
            self.mem.device = device.track_evictions();
        }
    }

    /// Blocks in the host tier (0: none).
    pub fn num_host_blocks(&self) -> usize {
        self.mem.host.as_ref().map_or(0, |h| h.pool.num_blocks())
    }

    /// Keeps at most `max_tokens` of the last lookup's hit (whole blocks); returns the hit in
    /// tokens.
    pub fn limit_hits(&mut self, req: RequestId, max_tokens: usize) -> usize {
        let Some(e) = self.reqs.get_mut(&req) else {
            return 0;
        };
        e.hits.truncate(max_tokens / self.block_size);
        e.hits.len() * self.block_size
    }

    /// Sets the bytes of one block across all layers, K and V (the copy metrics count bytes).
    pub fn with_block_bytes(mut self, bytes: usize) -> Self {
        self.mem.block_bytes = bytes;
        self
    }

    pub fn block_bytes(&self) -> usize {
        self.mem.block_bytes
    }

    pub fn has_host_tier(&self) -> bool {
        self.mem.host.is_some()
    }

    /// The host tier's usage (`used_blocks`: held by swapped requests), if there is one.
    pub fn host_usage(&self) -> Option<KvUsage> {
        self.mem.host.as_ref().map(|h| KvUsage {
            used_blocks: h.pool.num_used(),
            total_blocks: h.pool.num_blocks(),
            cached_blocks: h.pool.num_cached(),
        })
    }

    pub fn tier_stats(&self) -> TierStats {
        self.mem.stats
    }

    pub fn is_swapped(&self, req: RequestId) -> bool {
        self.mem
            .host
            .as_ref()
            .is_some_and(|h| h.swapped.contains_key(&req))
    }

    /// What swapping `req` out would take: (blocks copied to the host now, blocks to copy back
    /// on resume), or None when it cannot be swapped out now (no host tier, nothing held, or too
    /// few host blocks free: the caller recomputes instead). Blocks the host holds already under
    /// their hash are not copied out again.
    pub fn swap_out_plan(&self, req: RequestId) -> Option<(usize, usize)> {
        let host = self.mem.host.as_ref()?;
        let entry = self.reqs.get(&req)?;
        let live: Vec<BlockId> = entry
            .blocks
            .iter()
            .copied()
            .filter(|&b| b != NULL_BLOCK)
            .collect();
        if live.is_empty() {
            return None;
        }
        let (mut copies, mut taken) = (0, 0);
        for &b in &live {
            match self.mem.device.block_hash(b).and_then(|h| host.lookup(h)) {
                Some(h) => taken += usize::from(host.pool.ref_count(h) == 0),
                None => copies += 1,
            }
        }
        (copies + taken <= host.pool.num_free()).then_some((copies, live.len()))
    }

    /// Moves `req`'s blocks to the host tier (copies planned for the blocks the host does not
    /// hold yet) and drops its device references. False, changing nothing, when it cannot
    /// (`swap_out_plan` is None).
    pub fn swap_out(&mut self, req: RequestId) -> bool {
        if self.swap_out_plan(req).is_none() {
            return false;
        }
        let entry = self.reqs.remove(&req).expect("swap_out_plan found it");
        let Mem { device, host, .. } = &mut self.mem;
        let host = host.as_mut().expect("swap_out_plan found a host tier");
        let hashes: Vec<Option<BlockHash>> = entry
            .blocks
            .iter()
            .map(|&b| (b != NULL_BLOCK).then(|| device.block_hash(b)).flatten())
            .collect();
        // Blocks the host holds already are pinned first, so fresh allocations cannot evict them.
        let mut entries = vec![NULL_BLOCK; entry.blocks.len()];
        for (i, h) in hashes.iter().enumerate() {
            if let Some(found) = h.and_then(|h| host.pool.lookup(h)) {
                host.pool.touch(found);
                entries[i] = found;
            }
        }
        let mut out_copies = Vec::new();
        for (i, &b) in entry.blocks.iter().enumerate() {
            if b == NULL_BLOCK || entries[i] != NULL_BLOCK {
                continue;
            }
            let mut out = Vec::with_capacity(1);
            let ok = host.pool.allocate(1, &mut out);
            debug_assert!(ok, "swap_out_plan counted the free host blocks");
            entries[i] = out[0];
            if let Some(h) = hashes[i] {
                host.pool.cache(out[0], h);
            }
            out_copies.push(BlockCopy::to_host(b, out[0]));
        }
        // Copied under this step's forward: the blocks stay fenced off until the step is built.
        for c in out_copies {
            self.mem.copy_overlapped(c, None);
        }
        for &b in entry.blocks.iter().rev().filter(|&&b| b != NULL_BLOCK) {
            self.mem.device.release(b);
        }
        self.mem.stats.swapped_out_requests += 1;
        let host = self
            .mem
            .host
            .as_mut()
            .expect("swap_out_plan found a host tier");
        host.swapped.insert(
            req,
            Swapped {
                entries,
                hashes,
                table_hashes: entry.hashes,
                num_cached_blocks: entry.num_cached_blocks,
                num_freed: entry.num_freed,
            },
        );
        true
    }

    /// Device blocks a swapped request needs to come back: (fresh blocks, of which copies from
    /// the host); blocks still cached on the device are taken as they are.
    fn swap_in_needs(&self, s: &Swapped) -> (usize, usize) {
        let (mut fresh, mut copies) = (0, 0);
        for (i, &h) in s.entries.iter().enumerate() {
            if h == NULL_BLOCK {
                continue;
            }
            match s.hashes[i].and_then(|x| self.mem.device.lookup(x)) {
                Some(d) => fresh += usize::from(self.mem.unheld(d)),
                None => {
                    fresh += 1;
                    copies += 1;
                }
            }
        }
        (fresh, copies)
    }

    /// Blocks a swapped request would copy back from the host now (0 when not swapped).
    pub fn swap_in_copies(&self, req: RequestId) -> usize {
        let Some(s) = self.mem.host.as_ref().and_then(|h| h.swapped.get(&req)) else {
            return 0;
        };
        self.swap_in_needs(s).1
    }

    /// Brings a swapped request's table back to the device: blocks still cached there are
    /// taken, the rest get fresh blocks and copies from the host. False, changing nothing, when
    /// too few device blocks are free. The request computes from where it stopped; the copies
    /// run before the next step that reads them.
    pub fn swap_in(&mut self, req: RequestId) -> bool {
        let Some(s) = self.mem.host.as_mut().and_then(|h| h.swapped.remove(&req)) else {
            return false;
        };
        if !self.mem.make_free(self.swap_in_needs(&s).0) {
            self.mem
                .host
                .as_mut()
                .expect("it was swapped")
                .swapped
                .insert(req, s);
            return false;
        }
        // Blocks still cached on the device are referenced first, so that allocating the
        // others cannot evict them (`swap_in_needs` counted them as taken as they are).
        let cached: Vec<Option<BlockId>> = s
            .entries
            .iter()
            .zip(&s.hashes)
            .map(|(&h, x)| {
                let d = x.filter(|_| h != NULL_BLOCK)?;
                let d = self.mem.device.lookup(d)?;
                self.mem.device.touch(d);
                Some(d)
            })
            .collect();
        let mut blocks = Vec::with_capacity(s.entries.len());
        for (i, &h) in s.entries.iter().enumerate() {
            if h == NULL_BLOCK {
                blocks.push(NULL_BLOCK);
                continue;
            }
            if let Some(d) = cached[i] {
                blocks.push(d);
                continue;
            }
            let at = blocks.len();
            self.mem.alloc_device(1, &mut blocks);
            // Read from the next step on (the request is loading): overlapped.
            self.mem
                .copy_overlapped(BlockCopy::to_device(h, blocks[at]), s.hashes[i]);
        }
        let host = self.mem.host.as_mut().expect("it was swapped");
        // Copies run in list order, so the host blocks may be reused by later decisions.
        for &h in s.entries.iter().rev().filter(|&&h| h != NULL_BLOCK) {
            host.pool.release(h);
        }
        self.mem.stats.swapped_in_requests += 1;
        self.reqs.insert(
            req,
            ReqBlocks {
                blocks,
                hashes: s.table_hashes,
                num_cached_blocks: s.num_cached_blocks,
                hits: Vec::new(),
                queried_tokens: 0,
                num_freed: s.num_freed,
            },
        );
        true
    }
}
