//! Physical KV blocks: reference counts, an LRU free list, and the prefix-cache map.
//!
//! As in vLLM v1's `BlockPool`: a block whose reference count is 0 sits in the free list, which
//! doubles as the eviction order. New blocks come from the head. A freed full block keeps its
//! hash, and stays findable by a prefix lookup, until it is handed out again; a lookup hit on a
//! free block takes it out of the middle of the list. The list is intrusive (prev/next indices in
//! the block records), so every operation is O(1) and allocates nothing.

use foldhash::{HashMap, HashMapExt};
use std::hash::{DefaultHasher, Hash, Hasher};

/// Index of a physical block in the executor's KV pool.
pub type BlockId = u32;

/// Hash of a full block's tokens *and* of everything before it: `chain(parent, tokens)`, so equal
/// blocks after different prefixes differ. 128 bits (two SipHash passes under distinct tags)
/// make an accidental collision, which would silently serve another prefix's KV, negligible.
/// It does not resist a client crafting collisions on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(u128);

impl BlockHash {
    /// The parent of a sequence's first block (an arbitrary constant).
    pub const ROOT: BlockHash = BlockHash(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834);

    pub fn chain(parent: BlockHash, tokens: &[u32]) -> BlockHash {
        let half = |tag: u8| {
            let mut h = DefaultHasher::new();
            tag.hash(&mut h);
            parent.0.hash(&mut h);
            tokens.hash(&mut h);
            h.finish()
        };
        BlockHash(((half(0) as u128) << 64) | half(1) as u128)
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_cnt: u32,
    /// Set once the block is full, computed and registered in `cached`.
    hash: Option<BlockHash>,
    /// Free-list links; meaningful only while `ref_cnt == 0`.
    prev: u32,
    next: u32,
}

#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, BlockId>,
    /// Cached blocks `allocate` evicted since the last `drain_evicted`, with their hashes, when
    /// evictions are tracked (a device pool whose evicted blocks go to the host tier).
    evicted: Option<Vec<(BlockId, BlockHash)>>,
}

impl BlockPool {
    /// All blocks start free, in id order.
    pub fn new(num_blocks: usize) -> Self {
        assert!(
            num_blocks < NIL as usize,
            "{num_blocks} KV blocks do not fit u32 ids"
        );
        let n = num_blocks as u32;
        let blocks = (0..n)
            .map(|i| Block {
                ref_cnt: 0,
                hash: None,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == n { NIL } else { i + 1 },
            })
            .collect();
        BlockPool {
            blocks,
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            num_free: num_blocks,
            cached: HashMap::new(),
            evicted: None,
        }
    }

    /// Records the cached blocks `allocate` evicts, for `drain_evicted` (which the owner must
    /// then call after every allocation).
    pub fn track_evictions(mut self) -> Self {
        self.evicted = Some(Vec::new());
        self
    }

    /// The cached blocks evicted since the last call, oldest first, with the hashes they held.
    pub fn drain_evicted(&mut self) -> impl Iterator<Item = (BlockId, BlockHash)> + '_ {
        self.evicted.iter_mut().flat_map(|v| v.drain(..))
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks with no reference, cached or not: all of them can be handed out.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks findable by prefix lookup (in use or free).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_cnt
    }

    pub fn block_hash(&self, id: BlockId) -> Option<BlockHash> {
        self.blocks[id as usize].hash
    }

    /// Blocks referenced by at least one holder.
    pub fn num_used(&self) -> usize {
        self.blocks.len() - self.num_free
    }

    /// The cached block holding exactly this prefix, if any.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(&hash).copied()
    }

    /// Appends `n` blocks (reference count 1) from the head of the free list to `out`, evicting
    /// their cached hashes; or, when fewer than `n` are free, appends nothing and returns false.
    pub fn allocate(&mut self, n: usize, out: &mut Vec<BlockId>) -> bool {
        if n > self.num_free {
            return false;
        }
        out.reserve(n);
        for _ in 0..n {
            let id = self.head;
            self.unlink(id);
            let block = &mut self.blocks[id as usize];
            block.ref_cnt = 1;
            if let Some(hash) = block.hash.take() {
                self.cached.remove(&hash);
                if let Some(ev) = &mut self.evicted {
                    ev.push((id, hash));
                }
            }
            out.push(id);
        }
        true
    }

    /// Takes a reference to a block found by `lookup` (a prefix-cache hit); a free block leaves
    /// the free list.
    pub fn touch(&mut self, id: BlockId) {
        if self.blocks[id as usize].ref_cnt == 0 {
            self.unlink(id);
        }
        self.blocks[id as usize].ref_cnt += 1;
    }

    /// Drops a reference; at zero the block goes to the tail of the free list, keeping its hash
    /// so that a later request with the same prefix can still hit it.
    pub fn release(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        debug_assert!(block.ref_cnt > 0, "block {id} released with no reference");
        if block.ref_cnt == 0 {
            return;
        }
        block.ref_cnt -= 1;
        if block.ref_cnt == 0 {
            self.push_back(id);
        }
    }

    /// Registers a full, computed block under `hash`. When another block already holds the same
    /// prefix (two requests computed it at once) this one stays unregistered, so block tables
    /// never have to change; it returns false then.
    pub fn cache(&mut self, id: BlockId, hash: BlockHash) -> bool {
        if self.blocks[id as usize].hash.is_some() {
            return false;
        }
        match self.cached.entry(hash) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(id);
                self.blocks[id as usize].hash = Some(hash);
                true
            }
        }
    }

    /// Unregisters every cached block (free ones stay free, in LRU order); returns how many.
    pub fn forget_cached(&mut self) -> usize {
        let n = self.cached.len();
        for (_, id) in self.cached.drain() {
            self.blocks[id as usize].hash = None;
        }
        n
    }

    fn unlink(&mut self, id: BlockId) {
        let Block { prev, next, .. } = self.blocks[id as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let block = &mut self.blocks[id as usize];
        block.prev = NIL;
        block.next = NIL;
        self.num_free -= 1;
    }

    fn push_back(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        block.prev = self.tail;
        block.next = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.blocks[self.tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    /// Free-list order, head (next to be evicted) first.
    #[cfg(test)]
    pub(crate) fn free_list(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut cur = self.head;
        while cur != NIL {
            out.push(cur);
            cur = self.blocks[cur as usize].next;
        }
        out
    }

    /// The free list holds exactly the unreferenced blocks, its links agree both ways, and the
    /// hash map and the blocks' hashes mirror each other.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let list = self.free_list();
        if list.len() != self.num_free {
            return Err(format!(
                "free list has {} blocks, num_free {}",
                list.len(),
                self.num_free
            ));
        }
        let mut prev = NIL;
        for &id in &list {
            let b = &self.blocks[id as usize];
            if b.ref_cnt != 0 || b.prev != prev {
                return Err(format!(
                    "free block {id}: ref {} prev {} (want {prev})",
                    b.ref_cnt, b.prev
                ));
            }
            prev = id;
        }
        if self.tail != prev {
            return Err(format!("tail {} != last free block {prev}", self.tail));
        }
        let unreferenced = self.blocks.iter().filter(|b| b.ref_cnt == 0).count();
        if unreferenced != self.num_free {
            return Err(format!(
                "{unreferenced} unreferenced blocks, {} free",
                self.num_free
            ));
        }
        for (hash, &id) in &self.cached {
            if self.blocks[id as usize].hash != Some(*hash) {
                return Err(format!("cached block {id} does not carry its hash"));
            }
        }
        let hashed = self.blocks.iter().filter(|b| b.hash.is_some()).count();
        if hashed != self.cached.len() {
            return Err(format!(
                "{hashed} hashed blocks, {} in the map",
                self.cached.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> BlockPool {
        BlockPool::new(n)
    }

    fn alloc(p: &mut BlockPool, n: usize) -> Vec<BlockId> {
        let mut out = Vec::new();
        assert!(p.allocate(n, &mut out));
        out
    }

    #[test]
    fn allocate_and_release_track_ref_counts() {
        let mut p = pool(7);
        let a = alloc(&mut p, 3);
        assert_eq!(a, vec![0, 1, 2]);
        assert_eq!(p.num_free(), 4);
        assert!(a.iter().all(|&b| p.ref_count(b) == 1));
        p.touch(a[1]);
        assert_eq!(p.ref_count(a[1]), 2);
        for &b in &a {
            p.release(b);
        }
        assert_eq!(p.ref_count(a[1]), 1);
        assert_eq!(p.num_free(), 6);
        p.release(a[1]);
        assert_eq!(p.num_free(), 7);
        p.check_invariants().unwrap();
    }

    #[test]
    fn exhaustion_allocates_nothing() {
        let mut p = pool(5);
        let a = alloc(&mut p, 4);
        let mut out = vec![42];
        assert!(!p.allocate(2, &mut out));
        assert_eq!(out, vec![42], "a failed allocation must not append");
        assert_eq!(p.num_free(), 1);
        p.check_invariants().unwrap();
        for b in a {
            p.release(b);
        }
        assert_eq!(p.num_free(), 5);
        assert_eq!(alloc(&mut p, 5).len(), 5);
        assert_eq!(p.num_free(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn freed_blocks_are_reused_least_recently_freed_first() {
        let mut p = pool(6);
        let a = alloc(&mut p, 6);
        for &b in &[a[4], a[1], a[3]] {
            p.release(b);
        }
        assert_eq!(p.free_list(), vec![a[4], a[1], a[3]]);
        assert_eq!(alloc(&mut p, 2), vec![a[4], a[1]]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn free_cached_block_stays_findable_until_evicted() {
        let mut p = pool(3);
        let a = alloc(&mut p, 3);
        let h = BlockHash::chain(BlockHash::ROOT, &[17, 4, 99, 23]);
        assert!(p.cache(a[0], h));
        p.release(a[0]);
        p.release(a[2]);
        assert_eq!(p.lookup(h), Some(a[0]));
        assert_eq!(p.num_cached(), 1);

        // A hit takes the block out of the middle-or-head of the free list.
        p.touch(a[0]);
        assert_eq!(p.ref_count(a[0]), 1);
        assert_eq!(p.free_list(), vec![a[2]]);
        p.check_invariants().unwrap();

        // Freed again, then evicted when allocation reaches it: its hash goes away.
        p.release(a[0]);
        assert_eq!(alloc(&mut p, 2), vec![a[2], a[0]]);
        assert_eq!(p.lookup(h), None);
        assert_eq!(p.block_hash(a[0]), None);
        p.check_invariants().unwrap();
    }

    #[test]
    fn second_block_with_same_hash_is_not_registered() {
        let mut p = pool(4);
        let a = alloc(&mut p, 2);
        let h = BlockHash::chain(BlockHash::ROOT, &[5, 81, 2, 64]);
        assert!(p.cache(a[0], h));
        assert!(!p.cache(a[1], h));
        assert_eq!(p.lookup(h), Some(a[0]));
        assert_eq!(p.block_hash(a[1]), None);
        p.check_invariants().unwrap();
    }

    #[test]
    fn evictions_are_reported_only_when_tracked() {
        let mut p = pool(2).track_evictions();
        let a = alloc(&mut p, 2);
        let h = BlockHash::chain(BlockHash::ROOT, &[1, 2]);
        assert!(p.cache(a[1], h));
        p.release(a[1]);
        p.release(a[0]);
        assert_eq!(alloc(&mut p, 1), vec![a[1]]);
        assert_eq!(p.drain_evicted().collect::<Vec<_>>(), vec![(a[1], h)]);
        assert_eq!(alloc(&mut p, 1), vec![a[0]]);
        assert_eq!(
            p.drain_evicted().count(),
            0,
            "an uncached block evicts nothing"
        );
        let mut q = pool(1);
        let b = alloc(&mut q, 1);
        assert!(q.cache(b[0], h));
        q.release(b[0]);
        alloc(&mut q, 1);
        assert_eq!(q.drain_evicted().count(), 0);
    }

    #[test]
    fn chained_hash_depends_on_the_prefix() {
        let block = [31, 7, 256, 1000];
        let after_a = BlockHash::chain(BlockHash::chain(BlockHash::ROOT, &[1, 2, 3, 4]), &block);
        let after_b = BlockHash::chain(BlockHash::chain(BlockHash::ROOT, &[1, 2, 3, 5]), &block);
        assert_ne!(after_a, after_b);
        let again = BlockHash::chain(BlockHash::chain(BlockHash::ROOT, &[1, 2, 3, 4]), &block);
        assert_eq!(after_a, again);
        assert_ne!(BlockHash::chain(BlockHash::ROOT, &block), after_a);
    }
}
