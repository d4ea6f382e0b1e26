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

use std::collections::HashMap;

use crate::kv::block_pool::{BlockHash, BlockId, BlockPool};
use crate::request::RequestId;

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
}

#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    enable_prefix_caching: bool,
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
            reqs: HashMap::new(),
            stats: PrefixCacheStats::default(),
        }
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
            self.pool.cache(entry.blocks[i], entry.hashes[i]);
        }
        entry.num_cached_blocks = num_full;
    }

    /// Drops `req`'s references, last block first: freed blocks join the LRU tail in that order,
    /// so a sequence's tail is evicted before the prefix that other requests are likelier to
    /// share. Unknown ids are a no-op.
    pub fn free(&mut self, req: RequestId) {
        if let Some(entry) = self.reqs.remove(&req) {
            for &block in entry.blocks.iter().rev() {
                self.pool.release(block);
            }
        }
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

    /// `req`'s physical blocks in position order (empty when it holds none).
    pub fn block_table(&self, req: RequestId) -> &[u32] {
        self.reqs.get(&req).map_or(&[], |e| &e.blocks)
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
            let mut seen = std::collections::HashSet::new();
            for &b in &entry.blocks {
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
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const BS: usize = 4;

    fn manager(num_blocks: usize) -> KvCacheManager {
        KvCacheManager::new(num_blocks, BS, true)
    }

    fn tokens(seed: u64, n: usize) -> Vec<u32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(3..32_000)).collect()
    }

    /// Admits `req` like the scheduler does: lookup, allocate the rest, then (the step ran)
    /// register the computed blocks. Returns the cache hit in tokens.
    fn admit(kv: &mut KvCacheManager, req: u64, toks: &[u32]) -> Option<usize> {
        let id = RequestId(req);
        let hit = kv.get_computed_blocks(id, toks);
        kv.allocate_slots(id, hit, toks.len() - hit)?;
        kv.cache_computed_blocks(id, toks, toks.len());
        Some(hit)
    }

    #[test]
    fn allocation_covers_tokens_and_grows_by_blocks() {
        let mut kv = manager(10);
        let id = RequestId(7);
        assert_eq!(kv.allocate_slots(id, 0, 9), Some(3));
        assert_eq!(kv.block_table(id).len(), 3);
        // Tokens 9..12 fit in the third block.
        assert_eq!(kv.allocate_slots(id, 9, 3), Some(0));
        assert_eq!(kv.allocate_slots(id, 12, 1), Some(1));
        assert_eq!(kv.block_table(id).len(), 4);
        assert_eq!(kv.usage().used_blocks, 4);
        kv.check_invariants().unwrap();
        kv.free(id);
        assert_eq!(kv.usage().used_blocks, 0);
        assert!(kv.block_table(id).is_empty());
        kv.check_invariants().unwrap();
    }

    #[test]
    fn out_of_blocks_returns_none_and_allocates_nothing() {
        let mut kv = manager(5);
        let a = RequestId(1);
        let b = RequestId(2);
        assert!(kv.allocate_slots(a, 0, 13).is_some());
        assert_eq!(kv.allocate_slots(b, 0, 5), None);
        assert!(kv.block_table(b).is_empty());
        assert_eq!(kv.allocate_slots(a, 13, 8), None);
        assert_eq!(kv.block_table(a).len(), 4);
        assert_eq!(kv.usage().used_blocks, 4);
        kv.check_invariants().unwrap();
        kv.free(a);
        kv.free(b);
        assert_eq!(kv.usage().used_blocks, 0);
    }

    #[test]
    fn identical_prefix_hits_the_same_blocks() {
        let mut kv = manager(16);
        let prompt = tokens(11, 18);
        assert_eq!(admit(&mut kv, 1, &prompt), Some(0));
        let shared = prompt[..13].to_vec();
        let mut other = shared.clone();
        other.extend(tokens(12, 6));
        assert_eq!(admit(&mut kv, 2, &other), Some(12));
        let (ta, tb) = (kv.block_table(RequestId(1)), kv.block_table(RequestId(2)));
        assert_eq!(ta[..3], tb[..3]);
        assert_ne!(ta[3], tb[3]);
        assert!(ta[..3].iter().all(|&b| kv.pool().ref_count(b) == 2));
        let stats = kv.prefix_cache_stats();
        assert_eq!(stats.requests, 2);
        assert_eq!(stats.queried_tokens, (prompt.len() + other.len()) as u64);
        assert_eq!(stats.hit_tokens, 12);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn lookup_never_covers_the_whole_prompt() {
        let mut kv = manager(8);
        let prompt = tokens(21, 3 * BS);
        admit(&mut kv, 1, &prompt).unwrap();
        assert_eq!(kv.get_computed_blocks(RequestId(2), &prompt), 2 * BS);
    }

    #[test]
    fn a_reset_prefix_cache_finds_nothing_and_keeps_the_pool_consistent() {
        let mut kv = manager(16);
        let prompt = tokens(11, 18);
        assert_eq!(admit(&mut kv, 1, &prompt), Some(0));
        assert_eq!(admit(&mut kv, 2, &prompt), Some(16));
        kv.free(RequestId(1));
        assert_eq!(kv.reset_prefix_cache(), 4);
        assert_eq!(kv.usage().cached_blocks, 0);
        kv.check_invariants().unwrap();
        // Neither a new request nor the one still holding the blocks registers stale K/V.
        assert_eq!(admit(&mut kv, 3, &prompt), Some(0));
        kv.free(RequestId(2));
        kv.free(RequestId(3));
        assert_eq!(kv.usage().used_blocks, 0);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn same_block_after_a_different_prefix_misses() {
        let mut kv = manager(16);
        let tail = tokens(31, 2 * BS);
        let mut a = tokens(32, BS);
        a.extend(&tail);
        let mut b = tokens(33, BS);
        b.extend(&tail);
        b.push(9);
        admit(&mut kv, 1, &a).unwrap();
        assert_eq!(kv.get_computed_blocks(RequestId(2), &b), 0);
    }

    #[test]
    fn freed_prefix_is_reused_until_evicted() {
        let mut kv = manager(6);
        let prompt = tokens(41, 3 * BS + 2);
        admit(&mut kv, 1, &prompt).unwrap();
        let table = kv.block_table(RequestId(1)).to_vec();
        kv.free(RequestId(1));
        assert_eq!(kv.usage().used_blocks, 0);
        assert_eq!(kv.usage().cached_blocks, 3);
        // Freed tail first: the partial last block, then the cached ones from the back.
        let free = kv.pool().free_list();
        assert_eq!(
            free[free.len() - 4..],
            [table[3], table[2], table[1], table[0]]
        );

        assert_eq!(admit(&mut kv, 2, &prompt), Some(3 * BS));
        assert_eq!(kv.block_table(RequestId(2))[..3], table[..3]);
        kv.free(RequestId(2));

        // A request with another prompt needing every block evicts them all.
        let other = tokens(42, 6 * BS);
        assert_eq!(admit(&mut kv, 3, &other), Some(0));
        kv.free(RequestId(3));
        assert_eq!(kv.get_computed_blocks(RequestId(4), &prompt), 0);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn failed_allocation_does_not_take_the_hit_blocks() {
        let mut kv = manager(5);
        let prompt = tokens(51, 2 * BS + 1);
        admit(&mut kv, 1, &prompt).unwrap();
        kv.free(RequestId(1));
        // Another request holds 3 blocks; 2 are free and both hold the cached prefix.
        let filler = RequestId(9);
        kv.allocate_slots(filler, 0, 3 * BS).unwrap();
        let mut longer = prompt[..2 * BS].to_vec();
        longer.extend(tokens(52, 3 * BS));
        let hit = kv.get_computed_blocks(RequestId(2), &longer);
        assert_eq!(hit, 2 * BS);
        assert_eq!(
            kv.allocate_slots(RequestId(2), hit, longer.len() - hit),
            None
        );
        assert!(kv.block_table(RequestId(2)).is_empty());
        assert_eq!(kv.num_free_blocks(), 2);
        kv.check_invariants().unwrap();
        assert_eq!(
            kv.prefix_cache_stats().requests,
            1,
            "failed admission is not counted"
        );
    }

    #[test]
    fn disabled_prefix_caching_never_hits() {
        let mut kv = KvCacheManager::new(8, BS, false);
        let prompt = tokens(61, 10);
        admit(&mut kv, 1, &prompt).unwrap();
        kv.free(RequestId(1));
        assert_eq!(kv.get_computed_blocks(RequestId(2), &prompt), 0);
        assert_eq!(kv.usage().cached_blocks, 0);
    }

    #[test]
    fn random_admit_grow_free_keeps_counts_exact() {
        let mut rng = ChaCha8Rng::seed_from_u64(71);
        let mut kv = manager(40);
        let prefixes: Vec<Vec<u32>> = (0..3).map(|i| tokens(100 + i, 3 * BS)).collect();
        let mut live: Vec<(RequestId, Vec<u32>)> = Vec::new();
        for step in 0..2000u64 {
            match rng.random_range(0..3) {
                0 => {
                    let mut toks = prefixes[rng.random_range(0..3)].clone();
                    toks.truncate(rng.random_range(1..=3 * BS));
                    toks.extend(tokens(step, rng.random_range(1..20)));
                    if admit(&mut kv, step, &toks).is_some() {
                        live.push((RequestId(step), toks));
                    } else {
                        kv.free(RequestId(step));
                    }
                }
                1 if !live.is_empty() => {
                    let i = rng.random_range(0..live.len());
                    let (id, toks) = &mut live[i];
                    let n = toks.len();
                    toks.push(rng.random_range(3..32_000));
                    if kv.allocate_slots(*id, n, 1).is_some() {
                        kv.cache_computed_blocks(*id, toks, n + 1);
                    } else {
                        toks.pop();
                    }
                }
                _ if !live.is_empty() => {
                    let (id, _) = live.swap_remove(rng.random_range(0..live.len()));
                    kv.free(id);
                }
                _ => {}
            }
            kv.check_invariants().unwrap();
            for (id, toks) in &live {
                assert!(kv.block_table(*id).len() * BS >= toks.len());
            }
        }
        for (id, _) in live.drain(..) {
            kv.free(id);
        }
        assert_eq!(kv.usage().used_blocks, 0);
        assert!(kv.prefix_cache_stats().hit_tokens > 0);
        kv.check_invariants().unwrap();
    }
}
