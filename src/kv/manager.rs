//! Per-request block tables over the [`BlockPool`], with automatic prefix caching.
//!
//! Follows vLLM v1's `KVCacheManager`: `get_computed_blocks` finds the longest cached prefix of a
//! new request (in whole blocks), `allocate_slots` takes those blocks plus fresh ones so the table
//! covers the tokens to be computed (all or nothing), `free` drops the references.
//!
//! One deliberate difference: vLLM registers a block's hash when it allocates the slots, before
//! the step has written the block. That is only sound when the executor writes every sequence's
//! K/V before any sequence attends, which brook's `Backend` contract does not promise (a CPU
//! backend may run sequences in parallel). Here a block is registered by
//! [`KvCacheManager::cache_computed_blocks`], once the step that filled it has completed, so a hit
//! always reads finished K/V.
//!
//! Sliding-window models (`with_sliding_window`): a block every future query of a request sees
//! past (all its positions before the window of the next token to compute) goes back to the pool
//! when the request next allocates, like vLLM's `SlidingWindowManager.remove_skipped_blocks`. Its
//! table entry becomes [`NULL_BLOCK`], which keeps positions at their index; backends never read
//! it (attention starts at the window), and `BatchInput::validate_window` allows it only there.
//! Freed entries are always a prefix of the table; its length (`num_freed_blocks`) is how the
//! scheduler tells the executor, whose copy of the table it changes (`ScheduledRequest`).
//!
//! Host tier (`with_host_tier`, `manager/tiers.rs`): a second pool of blocks in CPU memory.
//! A cached device block that allocation evicts is written back to it instead of being dropped;
//! the prefix lookup finds hits in both tiers and brings host blocks back; a preempted request
//! can be swapped out whole and swapped back in. Every copy is planned here, in order, and
//! handed to the step (`take_copies`, `step::kv_copy`).
//!
//! Forking (`fork`, for `n > 1`): a child takes the parent's table with a reference on every
//! block. Full blocks are never written again, so they stay shared; the one block a sequence
//! still writes, its partial last block, is copied by the first writer that finds it shared
//! (copy-on-write, driven by the reference count), so no sequence ever writes a block another
//! holds.

use foldhash::{HashMap, HashMapExt};

use crate::kv::block_pool::{BlockHash, BlockId, BlockPool};
use crate::request::RequestId;
use crate::step::BlockCopy;
pub use crate::step::NULL_BLOCK;

mod in_flight;
mod tiers;

pub use tiers::TierStats;

/// Block usage for metrics (`kv_cache_usage_perc`, blocks used / total).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvUsage {
    /// Blocks referenced by at least one request.
    pub used_blocks: usize,
    pub total_blocks: usize,
    /// Blocks registered in the prefix cache, in use or free (reusable until evicted).
    pub cached_blocks: usize,
}

impl KvUsage {
    /// Used fraction in [0, 1]; cached but unreferenced blocks count as free, as in vLLM.
    pub fn usage_ratio(&self) -> f64 {
        if self.total_blocks == 0 {
            0.0
        } else {
            self.used_blocks as f64 / self.total_blocks as f64
        }
    }
}

/// Prefix-cache counters, in tokens, counted once per admission (a resumed preempted request
/// counts again, as in vLLM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixCacheStats {
    pub requests: u64,
    pub queried_tokens: u64,
    pub hit_tokens: u64,
    /// The part of `hit_tokens` found in the host tier (brought back to the device).
    pub host_hit_tokens: u64,
}

impl PrefixCacheStats {
    pub fn hit_rate(&self) -> f64 {
        if self.queried_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.queried_tokens as f64
        }
    }
}

/// A prefix-cache hit: a cached block in the device tier, or a copy in the host tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hit {
    Device(BlockId),
    Host(BlockId),
}

#[derive(Debug, Default, Clone)]
struct ReqBlocks {
    /// The block table: physical blocks for positions 0.., in order.
    blocks: Vec<BlockId>,
    /// Chained hashes of the request's full blocks so far, computed once each. A request's tokens
    /// only ever grow, so earlier hashes stay valid.
    hashes: Vec<BlockHash>,
    /// Leading blocks already registered in the prefix cache (or found there).
    num_cached_blocks: usize,
    /// Cached blocks found by the last lookup, not yet referenced; the next `allocate_slots`
    /// takes them. Valid until the pools change, so lookup and allocation go back to back.
    hits: Vec<Hit>,
    /// Prompt length of the last lookup, for the stats, counted when the allocation succeeds.
    queried_tokens: usize,
    /// Leading entries of `blocks` freed behind the sliding window (`NULL_BLOCK`).
    num_freed: usize,
}

/// Leading blocks of a request whose every position lies before the window of its next query:
/// with `num_computed` tokens in the cache, the next query sits at position `num_computed` and
/// sees keys `num_computed + 1 - window ..= num_computed`, and so does every later query.
pub fn blocks_outside_window(num_computed: usize, window: usize, block_size: usize) -> usize {
    (num_computed + 1).saturating_sub(window) / block_size
}

/// The pools and the copies planned between them, apart from the per-request tables so that
/// both can be borrowed at once.
#[derive(Debug)]
struct Mem {
    device: BlockPool,
    /// The host tier, when configured.
    host: Option<tiers::HostTier>,
    /// Copies planned since the last `take_copies`, in order.
    copies: Vec<BlockCopy>,
    stats: TierStats,
    /// Bytes of one block, all layers (metrics only; 0 when not set).
    block_bytes: usize,
    /// What the planned copies hold until the step is built (`manager/in_flight.rs`).
    in_flight: in_flight::InFlight,
}

impl Mem {
    /// Takes `n` device blocks (all or nothing; the caller checked they are free). Cached
    /// blocks it evicts are written back to the host tier first (copies before any reuse: the
    /// step's forward waits for them, it writes the blocks).
    fn alloc_device(&mut self, n: usize, out: &mut Vec<BlockId>) {
        let ok = self.device.allocate(n, out);
        debug_assert!(ok, "free blocks were checked by the caller");
        // Drained with or without a host tier (a rebuilt backend may have none any more).
        let evicted: Vec<(BlockId, BlockHash)> = self.device.drain_evicted().collect();
        for (block, hash) in evicted {
            if let Some(c) = self.host.as_mut().and_then(|h| h.offload(block, hash)) {
                self.stats.offloaded_blocks += 1;
                self.copy(c);
            }
        }
    }
}

#[derive(Debug)]
pub struct KvCacheManager {
    mem: Mem,
    block_size: usize,
    enable_prefix_caching: bool,
    /// Attention window of the model, in tokens; None: full attention.
    sliding_window: Option<usize>,
    reqs: HashMap<RequestId, ReqBlocks>,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        // Slots (block * block_size + offset) travel as u32 in the batch.
        assert!(
            num_blocks.saturating_mul(block_size) <= u32::MAX as usize,
            "{num_blocks} blocks of {block_size} tokens overflow u32 slot ids"
        );
        KvCacheManager {
            mem: Mem {
                device: BlockPool::new(num_blocks),
                host: None,
                copies: Vec::new(),
                stats: TierStats::default(),
                block_bytes: 0,
                in_flight: Default::default(),
            },
            block_size,
            enable_prefix_caching,
            sliding_window: None,
            reqs: HashMap::new(),
            stats: PrefixCacheStats::default(),
        }
    }

    /// Frees blocks that fall wholly outside a model's attention window (see the module doc).
    pub fn with_sliding_window(mut self, window: Option<usize>) -> Self {
        assert!(
            window != Some(0),
            "a sliding window holds at least one token"
        );
        self.sliding_window = window;
        self
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.mem.device.num_blocks()
    }

    /// Blocks an allocation can take now (free, including evictable cached ones).
    pub fn num_free_blocks(&self) -> usize {
        self.mem.num_free()
    }

    pub fn prefix_caching_enabled(&self) -> bool {
        self.enable_prefix_caching
    }

    /// Number of leading tokens of `tokens` (all known token ids of a request that holds no
    /// blocks yet) whose K/V is cached, in whole blocks, in either tier. Never the whole
    /// sequence: the last token is always left to compute, so the step produces its logits.
    /// Pair with an `allocate_slots` right after, with the returned count as `num_computed`
    /// (or fewer, after `truncate_hits`).
    pub fn get_computed_blocks(&mut self, req: RequestId, tokens: &[u32]) -> usize {
        if !self.enable_prefix_caching || tokens.is_empty() {
            return 0;
        }
        let bs = self.block_size;
        let entry = self.reqs.entry(req).or_default();
        if !entry.blocks.is_empty() {
            // Already holds blocks: its computed prefix is the caller's to know.
            debug_assert!(
                false,
                "{req}: prefix lookup for a request that holds blocks"
            );
            return 0;
        }
        let max_hit_blocks = (tokens.len() - 1) / bs;
        extend_hashes(&mut entry.hashes, tokens, max_hit_blocks, bs);
        entry.hits.clear();
        for hash in &entry.hashes[..max_hit_blocks] {
            let hit = match self.mem.device.lookup(*hash) {
                Some(block) => Hit::Device(block),
                None => match self.mem.host.as_ref().and_then(|h| h.lookup(*hash)) {
                    Some(block) => Hit::Host(block),
                    None => break,
                },
            };
            entry.hits.push(hit);
        }
        entry.queried_tokens = tokens.len();
        entry.hits.len() * bs
    }

    /// Of the last lookup's hit blocks, those in the host tier (each costs a copy back).
    pub fn num_host_hit_blocks(&self, req: RequestId) -> usize {
        self.reqs.get(&req).map_or(0, |e| {
            e.hits.iter().filter(|h| matches!(h, Hit::Host(_))).count()
        })
    }

    /// Keeps the last lookup's hits before the first host-tier one (bringing them back would
    /// cost more than computing them); returns the hit in tokens.
    pub fn drop_host_hits(&mut self, req: RequestId) -> usize {
        let Some(e) = self.reqs.get_mut(&req) else {
            return 0;
        };
        let keep = e
            .hits
            .iter()
            .position(|h| matches!(h, Hit::Host(_)))
            .unwrap_or(e.hits.len());
        e.hits.truncate(keep);
        keep * self.block_size
    }

    /// Makes `req`'s block table cover `num_computed + num_new_tokens` tokens, taking the blocks
    /// of the preceding `get_computed_blocks` hit first (a host-tier hit gets a fresh device
    /// block and a copy back). When the block the new tokens are written into is shared (a
    /// forked sequence), it is copied first. Returns the number of fresh blocks taken, or
    /// `None`, changing nothing, when too few blocks are free.
    pub fn allocate_slots(
        &mut self,
        req: RequestId,
        num_computed: usize,
        num_new_tokens: usize,
    ) -> Option<usize> {
        let bs = self.block_size;
        let mem = &mut self.mem;
        let entry = self.reqs.entry(req).or_default();
        if let Some(window) = self.sliding_window {
            // Before counting free blocks, so the freed ones serve this very allocation.
            let outside = blocks_outside_window(num_computed, window, bs).min(entry.blocks.len());
            for b in &mut entry.blocks[entry.num_freed.min(outside)..outside] {
                mem.device.release(std::mem::replace(b, NULL_BLOCK));
            }
            entry.num_freed = entry.num_freed.max(outside);
        }
        let num_hits = if entry.blocks.is_empty() {
            entry.hits.len().min(num_computed / bs)
        } else {
            0
        };
        debug_assert!(
            entry.blocks.len() + num_hits >= num_computed / bs,
            "{req}: {num_computed} computed tokens but only {} blocks",
            entry.blocks.len() + num_hits
        );
        let needed = (num_computed + num_new_tokens).div_ceil(bs);
        let num_fresh = needed.saturating_sub(entry.blocks.len() + num_hits);
        // A device hit on a free block takes it off the free list, so it competes with fresh
        // blocks; a host hit takes a fresh block.
        let taken_by_hits = entry.hits[..num_hits]
            .iter()
            .filter(|h| match h {
                Hit::Device(b) => mem.unheld(*b),
                Hit::Host(_) => true,
            })
            .count();
        // The block the first new token is written into, when it is shared: copied first.
        let cow_at = (num_new_tokens > 0)
            .then_some(num_computed / bs)
            .filter(|&i| {
                entry
                    .blocks
                    .get(i)
                    .is_some_and(|&b| b != NULL_BLOCK && mem.device.ref_count(b) > 1)
            });
        let num_cow = usize::from(cow_at.is_some());
        if !mem.make_free(num_fresh + taken_by_hits + num_cow) {
            return None;
        }
        if entry.blocks.is_empty() && entry.queried_tokens > 0 {
            self.stats.requests += 1;
            self.stats.queried_tokens += entry.queried_tokens as u64;
            self.stats.hit_tokens += (num_hits * bs) as u64;
            entry.queried_tokens = 0;
        }
        // Host hits are pinned while this allocation runs: a write-back of a block it evicts
        // from the device must not take a host block still to be copied back.
        let pinned = |mem: &mut Mem, hits: &[Hit], pin: bool| {
            if let Some(host) = &mut mem.host {
                for h in hits {
                    if let Hit::Host(b) = *h {
                        host.pin(b, pin);
                    }
                }
            }
        };
        pinned(mem, &entry.hits[..num_hits], true);
        // Device hits are referenced before any fresh block is taken for a host hit, so that
        // allocation cannot evict a free cached block this very table is about to take.
        for hit in &entry.hits[..num_hits] {
            if let Hit::Device(block) = *hit {
                mem.device.touch(block);
            }
        }
        for (i, hit) in entry.hits[..num_hits].iter().enumerate() {
            match *hit {
                Hit::Device(block) => entry.blocks.push(block),
                Hit::Host(host_block) => {
                    let at = entry.blocks.len();
                    mem.alloc_device(1, &mut entry.blocks);
                    let block = entry.blocks[at];
                    // Read from the next step on (the request is loading): overlapped.
                    mem.copy_overlapped(
                        BlockCopy::to_device(host_block, block),
                        Some(entry.hashes[i]),
                    );
                    self.stats.host_hit_tokens += bs as u64;
                }
            }
        }
        pinned(mem, &entry.hits[..num_hits], false);
        entry.num_cached_blocks = entry.num_cached_blocks.max(num_hits);
        entry.hits.clear();
        if let Some(i) = cow_at {
            let shared = entry.blocks[i];
            let mut fresh = Vec::with_capacity(1);
            mem.alloc_device(1, &mut fresh);
            mem.copy(BlockCopy::on_device(shared, fresh[0]));
            mem.device.release(shared);
            entry.blocks[i] = fresh[0];
        }
        mem.alloc_device(num_fresh, &mut entry.blocks);
        Some(num_fresh)
    }

    /// Registers `req`'s blocks that the first `num_computed` tokens fill, after the step that
    /// computed them, so other requests with the same prefix can reuse them. `tokens` are all of
    /// the request's known token ids.
    pub fn cache_computed_blocks(&mut self, req: RequestId, tokens: &[u32], num_computed: usize) {
        if !self.enable_prefix_caching {
            return;
        }
        let Some(entry) = self.reqs.get_mut(&req) else {
            return;
        };
        let bs = self.block_size;
        let num_full = (num_computed.min(tokens.len()) / bs).min(entry.blocks.len());
        if num_full <= entry.num_cached_blocks {
            return;
        }
        extend_hashes(&mut entry.hashes, tokens, num_full, bs);
        for i in entry.num_cached_blocks..num_full {
            // A block freed out of the window before it was registered stays unregistered.
            if entry.blocks[i] != NULL_BLOCK {
                self.mem.device.cache(entry.blocks[i], entry.hashes[i]);
            }
        }
        entry.num_cached_blocks = num_full;
    }

    /// `child` (which holds nothing) takes `parent`'s block table, one more reference on each
    /// block: parallel sampling's sequences share the prompt's blocks. The first of them to write
    /// into a still-shared block copies it (`allocate_slots`).
    pub fn fork(&mut self, parent: RequestId, child: RequestId) {
        let Some(p) = self.reqs.get(&parent) else {
            debug_assert!(false, "{parent}: forked, but it holds no blocks");
            return;
        };
        let mut c = p.clone();
        c.hits.clear();
        c.queried_tokens = 0;
        for &b in c.blocks.iter().filter(|&&b| b != NULL_BLOCK) {
            self.mem.device.touch(b);
        }
        let old = self.reqs.insert(child, c);
        debug_assert!(
            old.is_none_or(|o| o.blocks.is_empty()),
            "{child}: forked into a request that holds blocks"
        );
    }

    /// Drops `req`'s references, last block first: freed blocks join the LRU tail in that order,
    /// so a sequence's tail is evicted before the prefix that other requests are likelier to
    /// share. A swapped-out request's host blocks are released too. Unknown ids are a no-op.
    pub fn free(&mut self, req: RequestId) {
        if let Some(entry) = self.reqs.remove(&req) {
            for &block in entry.blocks.iter().rev().filter(|&&b| b != NULL_BLOCK) {
                self.mem.device.release(block);
            }
        }
        if let Some(host) = &mut self.mem.host {
            host.free_swapped(req);
        }
    }

    /// Speculative decoding's KV rollback: releases `req`'s blocks past those covering its first
    /// `num_tokens` positions (they held only rejected draft positions), last first. Returns
    /// how many. Registered blocks lie within the computed tokens, so none is touched.
    pub fn free_tail(&mut self, req: RequestId, num_tokens: usize) -> usize {
        let Some(entry) = self.reqs.get_mut(&req) else {
            return 0;
        };
        let keep = num_tokens
            .div_ceil(self.block_size)
            .max(entry.num_freed)
            .max(entry.num_cached_blocks);
        let mut released = 0;
        while entry.blocks.len() > keep {
            let block = entry.blocks.pop().expect("longer than keep");
            debug_assert_ne!(block, NULL_BLOCK, "freed entries are a prefix");
            self.mem.device.release(block);
            released += 1;
        }
        released
    }

    /// Forgets every cached prefix, in both tiers: the K/V they name is gone (the backend was
    /// rebuilt with fresh pools), and so are the copies planned for the old one. Requests still
    /// holding device blocks keep them, but none of their blocks is found by a lookup any more.
    /// No request may be swapped out (its host copy is gone too: the caller frees it first).
    /// Returns how many blocks were registered, both tiers.
    pub fn reset_prefix_cache(&mut self) -> usize {
        for entry in self.reqs.values_mut() {
            entry.num_cached_blocks = 0;
            entry.hits.clear();
        }
        self.mem.drop_planned(true);
        let host = self.mem.host.as_mut().map_or(0, |h| h.forget_cached());
        self.mem.device.forget_cached() + host
    }

    /// A new device pool of `num_blocks` (the backend was rebuilt with another size). No
    /// request may hold blocks; the prefix-cache counters carry on.
    pub fn resize_pool(&mut self, num_blocks: usize) {
        assert!(
            self.reqs.values().all(|e| e.blocks.is_empty()),
            "resizing the KV pool while requests hold blocks"
        );
        self.reqs.clear();
        self.mem.drop_planned(false);
        self.mem.device = BlockPool::new(num_blocks);
        if self.mem.host.is_some() {
            let device = std::mem::replace(&mut self.mem.device, BlockPool::new(0));
            self.mem.device = device.track_evictions();
        }
    }

    /// `req`'s physical blocks in position order (empty when it holds none); [`NULL_BLOCK`] for
    /// blocks freed out of the sliding window.
    pub fn block_table(&self, req: RequestId) -> &[u32] {
        self.reqs.get(&req).map_or(&[], |e| &e.blocks)
    }

    /// Leading entries of `req`'s block table freed out of the sliding window (all
    /// [`NULL_BLOCK`], and no other entry is); 0 under full attention.
    pub fn num_freed_blocks(&self, req: RequestId) -> usize {
        self.reqs.get(&req).map_or(0, |e| e.num_freed)
    }

    /// The device tier's usage.
    pub fn usage(&self) -> KvUsage {
        KvUsage {
            used_blocks: self.mem.device.num_used(),
            total_blocks: self.mem.device.num_blocks(),
            cached_blocks: self.mem.device.num_cached(),
        }
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// The copies planned since the last call, in the order they must run; the step being
    /// built carries them (`SchedulerOutput::kv_copies`). Ends the step's fences
    /// (`manager/in_flight.rs`).
    pub fn take_copies(&mut self) -> Vec<BlockCopy> {
        self.take_step_copies().0
    }

    /// [`KvCacheManager::take_copies`], and how many leading copies the step's forward waits
    /// for (`SchedulerOutput::kv_copies_for_forward`).
    pub fn take_step_copies(&mut self) -> (Vec<BlockCopy>, usize) {
        self.mem.take_copies()
    }

    #[cfg(test)]
    pub(crate) fn pool(&self) -> &BlockPool {
        &self.mem.device
    }

    /// Every block's reference count equals the number of tables holding it (host blocks: the
    /// swapped requests holding them); pool invariants.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.mem.device.check_invariants()?;
        let mut refs = vec![0u32; self.mem.device.num_blocks()];
        for &b in self.mem.fenced() {
            refs[b as usize] += 1;
        }
        for (id, entry) in &self.reqs {
            let nulls = entry.blocks.iter().filter(|&&b| b == NULL_BLOCK).count();
            let prefix = entry
                .blocks
                .iter()
                .take_while(|&&b| b == NULL_BLOCK)
                .count();
            if nulls != prefix || prefix != entry.num_freed {
                return Err(format!(
                    "{id}: {nulls} freed entries, {prefix} leading, {} counted",
                    entry.num_freed
                ));
            }
            let mut seen = std::collections::HashSet::new();
            for &b in entry.blocks.iter().filter(|&&b| b != NULL_BLOCK) {
                if !seen.insert(b) {
                    return Err(format!("{id}: block {b} twice in its table"));
                }
                refs[b as usize] += 1;
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            if self.mem.device.ref_count(b as BlockId) != r {
                return Err(format!(
                    "block {b}: ref count {} but {r} tables and fences",
                    self.mem.device.ref_count(b as BlockId)
                ));
            }
        }
        if let Some(host) = &self.mem.host {
            host.check_invariants()?;
            if let Some(id) = host.swapped_ids().find(|id| self.reqs.contains_key(id)) {
                return Err(format!("{id}: swapped out but holds device blocks"));
            }
        }
        Ok(())
    }
}

/// Extends `hashes` to the first `num_full` full blocks of `tokens`.
fn extend_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], num_full: usize, bs: usize) {
    debug_assert!(num_full * bs <= tokens.len());
    while hashes.len() < num_full {
        let i = hashes.len();
        let parent = hashes.last().copied().unwrap_or(BlockHash::ROOT);
        hashes.push(BlockHash::chain(parent, &tokens[i * bs..(i + 1) * bs]));
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;
