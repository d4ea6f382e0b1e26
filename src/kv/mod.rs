//! Paged KV-cache bookkeeping: which physical blocks each request owns. Pure data structures (plus a thin actor);
//! the KV tensors themselves live in the executor, addressed through block tables.
//!
//! - [`block_pool`]: blocks with reference counts, an LRU free list and the prefix-cache map.
//! - [`manager`]: per-request block tables on top of the pool (lookup, allocate, free, usage),
//!   the host tier (write-back of evicted prefix blocks, swap out and in) and forking with
//!   copy-on-write; every block copy it plans goes to the step (`step::kv_copy`).
pub mod actor;
pub mod block_pool;
pub mod manager;

pub use block_pool::{BlockHash, BlockId, BlockPool};
pub use manager::{KvCacheManager, KvUsage, PrefixCacheStats, TierStats, NULL_BLOCK};
