//! KvCacheManager: allocation, prefix caching, freeing, sliding windows.

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
fn blocks_outside_the_window_of_the_next_query() {
    // Window 8, blocks of 4: the next query at position p sees p-7..=p.
    assert_eq!(blocks_outside_window(0, 8, 4), 0);
    assert_eq!(blocks_outside_window(10, 8, 4), 0); // sees 3..=10: block 0 holds 3
    assert_eq!(blocks_outside_window(11, 8, 4), 1); // sees 4..=11
    assert_eq!(blocks_outside_window(14, 8, 4), 1);
    assert_eq!(blocks_outside_window(15, 8, 4), 2);
    // A window of one block's size: the block holding p - 3 stays.
    assert_eq!(blocks_outside_window(6, 4, 4), 0);
    assert_eq!(blocks_outside_window(7, 4, 4), 1);
    // A window shorter than a block.
    assert_eq!(blocks_outside_window(5, 1, 4), 1);
}

#[test]
fn sliding_window_frees_blocks_behind_the_window() {
    let mut kv = KvCacheManager::new(6, BS, true).with_sliding_window(Some(6));
    let id = RequestId(1);
    let toks = tokens(81, 40);
    // Prefill 9 tokens: blocks 0..3, nothing outside yet.
    assert_eq!(kv.allocate_slots(id, 0, 9), Some(3));
    kv.cache_computed_blocks(id, &toks, 9);
    assert_eq!(kv.usage().used_blocks, 3);
    // Decode at position 9 sees 4..=9: block 0 (0..=3) goes back.
    let first = kv.block_table(id)[0];
    assert_eq!(kv.allocate_slots(id, 9, 1), Some(0));
    assert_eq!(kv.block_table(id)[0], NULL_BLOCK);
    assert_eq!(kv.num_freed_blocks(id), 1);
    assert_eq!(kv.usage().used_blocks, 2);
    kv.check_invariants().unwrap();
    // The freed block is reused; a long run never holds more than the window needs.
    let mut n = 10;
    while n < 40 {
        kv.allocate_slots(id, n, 1).unwrap();
        kv.cache_computed_blocks(id, &toks, n + 1);
        n += 1;
        let live = kv
            .block_table(id)
            .iter()
            .filter(|&&b| b != NULL_BLOCK)
            .count();
        assert!(live <= 3, "{live} blocks live at {n} tokens");
        kv.check_invariants().unwrap();
    }
    assert!(kv.block_table(id).contains(&first) || kv.num_free_blocks() > 0);
    assert_eq!(kv.block_table(id).len(), 10);
    // Freeing the request returns the live blocks once each.
    kv.free(id);
    assert_eq!(kv.usage().used_blocks, 0);
    kv.check_invariants().unwrap();
}

#[test]
fn sliding_window_lets_a_long_request_run_in_a_small_pool() {
    // 4 blocks of 4 tokens and a window of 5: any length fits, full attention would not.
    let mut kv = KvCacheManager::new(4, BS, false).with_sliding_window(Some(5));
    let id = RequestId(3);
    kv.allocate_slots(id, 0, 7).unwrap();
    for n in 7..100 {
        assert!(kv.allocate_slots(id, n, 1).is_some(), "stuck at {n}");
    }
    let mut full = KvCacheManager::new(4, BS, false);
    full.allocate_slots(id, 0, 7).unwrap();
    assert!((7..100).any(|n| full.allocate_slots(id, n, 1).is_none()));
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
