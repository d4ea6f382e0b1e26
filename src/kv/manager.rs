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

use std::collections::HashMap;

use crate::kv::block_pool::{BlockHash, BlockId, BlockPool};
use crate::request::RequestId;
pub use crate::step::NULL_BLOCK;

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

#[derive(Debug, Default)]
struct ReqBlocks {
    /// The block table: physical blocks for positions 0.., in order.
    blocks: Vec<BlockId>,
    /// Chained hashes of the request's full blocks so far, computed once each. A request's tokens
    /// only ever grow, so earlier hashes stay valid.
    hashes: Vec<BlockHash>,
    /// Leading blocks already registered in the prefix cache (or found there).
    num_cached_blocks: usize,
    /// Cached blocks found by the last lookup, not yet referenced; the next `allocate_slots`
    /// takes them. Valid until the pool changes, so lookup and allocation go back to back.
    hits: Vec<BlockId>,
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

#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
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
            pool: BlockPool::new(num_blocks),
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
        self.pool.num_blocks()
    }

    /// Blocks an allocation can take now (free, including evictable cached ones).
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    pub fn prefix_caching_enabled(&self) -> bool {
        self.enable_prefix_caching
    }

    /// Number of leading tokens of `tokens` (all known token ids of a request that holds no
    /// blocks yet) whose K/V is cached, in whole blocks. Never the whole sequence: the last token
    /// is always left to compute, so the step produces its logits. Pair with an `allocate_slots`
    /// right after, with the returned count as `num_computed`.
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
            match self.pool.lookup(*hash) {
                Some(block) => entry.hits.push(block),
                None => break,
            }
        }
        entry.queried_tokens = tokens.len();
        entry.hits.len() * bs
    }

    /// Makes `req`'s block table cover `num_computed + num_new_tokens` tokens, taking the blocks
    /// of the preceding `get_computed_blocks` hit first. Returns the number of fresh blocks taken,
    /// or `None`, changing nothing, when too few blocks are free.
    pub fn allocate_slots(
        &mut self,
        req: RequestId,
        num_computed: usize,
        num_new_tokens: usize,
    ) -> Option<usize> {
        let bs = self.block_size;
        let entry = self.reqs.entry(req).or_default();
        if let Some(window) = self.sliding_window {
            // Before counting free blocks, so the freed ones serve this very allocation.
            let outside = blocks_outside_window(num_computed, window, bs).min(entry.blocks.len());
            for b in &mut entry.blocks[entry.num_freed.min(outside)..outside] {
                self.pool.release(std::mem::replace(b, NULL_BLOCK));
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
        // A hit on a free block takes it off the free list, so it competes with fresh blocks.
        let free_hits = entry.hits[..num_hits]
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        if num_fresh + free_hits > self.pool.num_free() {
            return None;
        }
        if entry.blocks.is_empty() && entry.queried_tokens > 0 {
            self.stats.requests += 1;
            self.stats.queried_tokens += entry.queried_tokens as u64;
            self.stats.hit_tokens += (num_hits * bs) as u64;
            entry.queried_tokens = 0;
        }
        for &block in &entry.hits[..num_hits] {
            self.pool.touch(block);
        }
        entry.blocks.extend_from_slice(&entry.hits[..num_hits]);
        entry.num_cached_blocks = entry.num_cached_blocks.max(num_hits);
        entry.hits.clear();
        let ok = self.pool.allocate(num_fresh, &mut entry.blocks);
        debug_assert!(ok, "free blocks were checked above");
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
                self.pool.cache(entry.blocks[i], entry.hashes[i]);
            }
        }
        entry.num_cached_blocks = num_full;
    }

    /// Drops `req`'s references, last block first: freed blocks join the LRU tail in that order,
    /// so a sequence's tail is evicted before the prefix that other requests are likelier to
    /// share. Unknown ids are a no-op.
    pub fn free(&mut self, req: RequestId) {
        if let Some(entry) = self.reqs.remove(&req) {
            for &block in entry.blocks.iter().rev().filter(|&&b| b != NULL_BLOCK) {
                self.pool.release(block);
            }
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
            self.pool.release(block);
            released += 1;
        }
        released
    }

    /// Forgets every cached prefix: the K/V they name is gone (the backend was rebuilt with a
    /// fresh pool). Requests still holding blocks keep them, but none of their blocks is found
    /// by a lookup any more. Returns how many blocks were registered.
    pub fn reset_prefix_cache(&mut self) -> usize {
        for entry in self.reqs.values_mut() {
            entry.num_cached_blocks = 0;
            entry.hits.clear();
        }
        self.pool.forget_cached()
    }

    /// A new pool of `num_blocks` (the backend was rebuilt with another size). No request may
    /// hold blocks; the prefix-cache counters carry on.
    pub fn resize_pool(&mut self, num_blocks: usize) {
        assert!(
            self.reqs.values().all(|e| e.blocks.is_empty()),
            "resizing the KV pool while requests hold blocks"
        );
        self.reqs.clear();
        self.pool = BlockPool::new(num_blocks);
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

    pub fn usage(&self) -> KvUsage {
        KvUsage {
            used_blocks: self.pool.num_blocks() - self.pool.num_free(),
            total_blocks: self.pool.num_blocks(),
            cached_blocks: self.pool.num_cached(),
        }
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    #[cfg(test)]
    pub(crate) fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Every block's reference count equals the number of tables holding it; pool invariants.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut refs = vec![0u32; self.pool.num_blocks()];
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
            if self.pool.ref_count(b as BlockId) != r {
                return Err(format!(
                    "block {b}: ref count {} but {r} tables",
                    self.pool.ref_count(b as BlockId)
                ));
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
