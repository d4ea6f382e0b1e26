//! KvCacheManager's host tier (write-back of evicted prefix blocks, hits across tiers, swap out
//! and in) and forking with copy-on-write. A small memory model applies the planned copies in
//! order and checks that every table reads back its own tokens.

use std::collections::HashMap;

use super::*;
use crate::step::CopyKind;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: usize = 4;

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(3..32_000)).collect()
}

/// Block contents, as the token ids of each slot, in both tiers; copies applied in order.
struct Memory {
    device: Vec<Option<u32>>,
    host: Vec<Option<u32>>,
}

impl Memory {
    fn new(device_blocks: usize, host_blocks: usize) -> Self {
        Memory {
            device: vec![None; device_blocks * BS],
            host: vec![None; host_blocks * BS],
        }
    }

    fn apply(&mut self, copies: &[BlockCopy]) {
        for c in copies {
            let (s, d) = (c.src as usize * BS, c.dst as usize * BS);
            match c.kind {
                CopyKind::DeviceToHost => {
                    let src = self.device[s..s + BS].to_vec();
                    self.host[d..d + BS].copy_from_slice(&src);
                }
                CopyKind::HostToDevice => {
                    let src = self.host[s..s + BS].to_vec();
                    self.device[d..d + BS].copy_from_slice(&src);
                }
                CopyKind::DeviceToDevice => {
                    let src = self.device[s..s + BS].to_vec();
                    self.device[d..d + BS].copy_from_slice(&src);
                }
            }
        }
    }

    /// A step writes `toks[from..to]` through `table`.
    fn write(&mut self, table: &[u32], toks: &[u32], from: usize, to: usize) {
        for (p, &t) in toks.iter().enumerate().take(to).skip(from) {
            self.device[table[p / BS] as usize * BS + p % BS] = Some(t);
        }
    }

    fn check(&self, id: RequestId, table: &[u32], toks: &[u32], upto: usize) {
        for (p, &t) in toks.iter().enumerate().take(upto) {
            let b = table[p / BS];
            if b == NULL_BLOCK {
                continue;
            }
            assert_eq!(
                self.device[b as usize * BS + p % BS],
                Some(t),
                "{id} at {p}"
            );
        }
    }
}

fn manager(device: usize, host: usize) -> KvCacheManager {
    KvCacheManager::new(device, BS, true).with_host_tier(host)
}

/// Admits `req` (lookup, allocation, copies, the step's write, registration).
fn admit(kv: &mut KvCacheManager, mem: &mut Memory, req: u64, toks: &[u32]) -> Option<usize> {
    let id = RequestId(req);
    let hit = kv.get_computed_blocks(id, toks);
    kv.allocate_slots(id, hit, toks.len() - hit)?;
    mem.apply(&kv.take_copies());
    mem.write(kv.block_table(id), toks, hit, toks.len());
    kv.cache_computed_blocks(id, toks, toks.len());
    Some(hit)
}

#[test]
fn evicted_prefix_blocks_go_to_the_host_and_come_back() {
    let (mut kv, mut mem) = (manager(4, 8), Memory::new(4, 8));
    let a = tokens(1, 3 * BS + 1);
    admit(&mut kv, &mut mem, 1, &a).unwrap();
    kv.free(RequestId(1));
    // Another prompt takes every device block: a's three cached blocks are written back.
    let b = tokens(2, 4 * BS);
    admit(&mut kv, &mut mem, 2, &b).unwrap();
    assert_eq!(kv.tier_stats().offloaded_blocks, 3);
    assert_eq!(kv.host_usage().unwrap().cached_blocks, 3);
    assert_eq!(kv.host_usage().unwrap().used_blocks, 0, "cached, not held");
    kv.free(RequestId(2));
    // a again: all three blocks hit in the host tier and are copied back.
    assert_eq!(kv.get_computed_blocks(RequestId(3), &a), 3 * BS);
    assert_eq!(kv.num_host_hit_blocks(RequestId(3)), 3);
    kv.allocate_slots(RequestId(3), 3 * BS, 1).unwrap();
    let copies = kv.take_copies();
    let back: Vec<_> = copies
        .iter()
        .filter(|c| c.kind == CopyKind::HostToDevice)
        .collect();
    assert_eq!(back.len(), 3);
    mem.apply(&copies);
    mem.check(RequestId(3), kv.block_table(RequestId(3)), &a, 3 * BS);
    let stats = kv.prefix_cache_stats();
    assert_eq!(
        (stats.hit_tokens, stats.host_hit_tokens),
        (3 * BS as u64, 3 * BS as u64)
    );
    kv.check_invariants().unwrap();
}

#[test]
fn host_hits_can_be_refused_when_copying_costs_more() {
    let (mut kv, mut mem) = (manager(4, 8), Memory::new(4, 8));
    let a = tokens(3, 3 * BS + 1);
    admit(&mut kv, &mut mem, 1, &a).unwrap();
    kv.free(RequestId(1));
    admit(&mut kv, &mut mem, 2, &tokens(4, 4 * BS)).unwrap();
    kv.free(RequestId(2));
    assert_eq!(kv.get_computed_blocks(RequestId(3), &a), 3 * BS);
    assert_eq!(kv.drop_host_hits(RequestId(3)), 0);
    kv.allocate_slots(RequestId(3), 0, a.len()).unwrap();
    assert!(kv
        .take_copies()
        .iter()
        .all(|c| c.kind != CopyKind::HostToDevice));
    kv.check_invariants().unwrap();
}

#[test]
fn swap_out_and_in_restores_the_table_contents() {
    let (mut kv, mut mem) = (manager(6, 8), Memory::new(6, 8));
    let id = RequestId(1);
    let toks = tokens(5, 2 * BS + 3);
    admit(&mut kv, &mut mem, 1, &toks).unwrap();
    assert_eq!(kv.swap_out_plan(id), Some((3, 3)));
    assert!(kv.swap_out(id));
    mem.apply(&kv.take_copies());
    assert!(kv.block_table(id).is_empty() && kv.is_swapped(id));
    assert_eq!(kv.usage().used_blocks, 0);
    assert_eq!(kv.host_usage().unwrap().used_blocks, 3);
    kv.check_invariants().unwrap();
    // Another request overwrites every device block, then goes.
    admit(&mut kv, &mut mem, 2, &tokens(6, 6 * BS)).unwrap();
    kv.free(RequestId(2));
    assert!(kv.swap_in(id));
    mem.apply(&kv.take_copies());
    mem.check(id, kv.block_table(id), &toks, toks.len());
    assert!(!kv.is_swapped(id));
    assert_eq!(kv.host_usage().unwrap().used_blocks, 0);
    let st = kv.tier_stats();
    assert_eq!((st.swapped_out_requests, st.swapped_in_requests), (1, 1));
    // It grows on as before.
    kv.allocate_slots(id, toks.len(), 1).unwrap();
    kv.free(id);
    assert_eq!(kv.usage().used_blocks, 0);
    kv.check_invariants().unwrap();
}

#[test]
fn a_swapped_request_takes_its_blocks_still_cached_on_the_device() {
    let (mut kv, mut mem) = (manager(8, 8), Memory::new(8, 8));
    let id = RequestId(1);
    let toks = tokens(7, 2 * BS + 1);
    admit(&mut kv, &mut mem, 1, &toks).unwrap();
    assert!(kv.swap_out(id));
    mem.apply(&kv.take_copies());
    // Nothing else ran: both full blocks are still cached on the device, only the partial
    // last block comes back from the host.
    assert_eq!(kv.swap_in_copies(id), 1);
    assert!(kv.swap_in(id));
    let copies = kv.take_copies();
    assert_eq!(copies.len(), 1);
    mem.apply(&copies);
    mem.check(id, kv.block_table(id), &toks, toks.len());
    kv.check_invariants().unwrap();
}

#[test]
fn a_full_host_tier_refuses_the_swap_and_changes_nothing() {
    let (mut kv, mut mem) = (manager(8, 2), Memory::new(8, 2));
    let id = RequestId(1);
    let toks = tokens(8, 3 * BS);
    admit(&mut kv, &mut mem, 1, &toks).unwrap();
    let table = kv.block_table(id).to_vec();
    assert_eq!(kv.swap_out_plan(id), None);
    assert!(!kv.swap_out(id));
    assert_eq!(kv.block_table(id), table);
    assert!(kv.take_copies().is_empty());
    assert_eq!(kv.host_usage().unwrap().used_blocks, 0);
    // No host tier at all: never.
    let mut plain = KvCacheManager::new(8, BS, true);
    plain.allocate_slots(id, 0, 5).unwrap();
    assert!(!plain.swap_out(id));
    kv.check_invariants().unwrap();
}

#[test]
fn freeing_a_swapped_request_returns_its_host_blocks() {
    let (mut kv, mut mem) = (manager(6, 6), Memory::new(6, 6));
    for r in 1..=2 {
        admit(&mut kv, &mut mem, r, &tokens(10 + r, 2 * BS + 2)).unwrap();
        assert!(kv.swap_out(RequestId(r)));
    }
    // The step that carries the copies is built: the fences end.
    mem.apply(&kv.take_copies());
    assert_eq!(kv.host_usage().unwrap().used_blocks, 6);
    kv.free(RequestId(1));
    kv.free(RequestId(2));
    kv.free(RequestId(3)); // unknown: no-op
    assert_eq!(kv.host_usage().unwrap().used_blocks, 0);
    assert_eq!(kv.usage().used_blocks, 0);
    kv.check_invariants().unwrap();
}

/// A rebuilt backend (after a panic) has fresh pools in both tiers: once the swapped request
/// is freed, the reset forgets cached prefixes in both, drops the copies planned for the old
/// backend, and resized pools start empty; nothing is found or held afterwards.
#[test]
fn a_reset_after_a_rebuild_forgets_both_tiers_and_leaks_nothing() {
    let (mut kv, mut mem) = (manager(4, 8), Memory::new(4, 8));
    let a = tokens(21, 3 * BS + 1);
    admit(&mut kv, &mut mem, 1, &a).unwrap();
    kv.free(RequestId(1));
    let b = tokens(22, 2 * BS + 2);
    admit(&mut kv, &mut mem, 2, &b).unwrap();
    assert!(
        kv.host_usage().unwrap().cached_blocks > 0,
        "a's prefix went to the host"
    );
    assert!(kv.swap_out(RequestId(2)));
    mem.apply(&kv.take_copies());
    // Copies planned for the old backend (a's host blocks coming back), then the panic: the
    // swapped request's host copy is gone too, so it is freed first (as
    // `Scheduler::executor_lost` does).
    let hit = kv.get_computed_blocks(RequestId(3), &a);
    assert!(kv.num_host_hit_blocks(RequestId(3)) > 0);
    kv.allocate_slots(RequestId(3), hit, 1).unwrap();
    kv.free(RequestId(3));
    kv.free(RequestId(2));
    assert!(kv.reset_prefix_cache() > 0);
    assert!(
        kv.take_copies().is_empty(),
        "copies for the old backend dropped"
    );
    let host = kv.host_usage().unwrap();
    assert_eq!((host.used_blocks, host.cached_blocks), (0, 0));
    assert_eq!(kv.usage().cached_blocks, 0);
    assert_eq!(
        kv.get_computed_blocks(RequestId(4), &a),
        0,
        "nothing found in either tier"
    );
    kv.check_invariants().unwrap();
    // The new backend's pools differ in size.
    kv.resize_pool(6);
    kv.resize_host_tier(3);
    assert_eq!((kv.num_blocks(), kv.num_host_blocks()), (6, 3));
    let mut mem = Memory::new(6, 3);
    admit(&mut kv, &mut mem, 5, &a).unwrap();
    kv.free(RequestId(5));
    // Evictions still go to the (new) host tier.
    admit(&mut kv, &mut mem, 6, &tokens(23, 6 * BS)).unwrap();
    assert!(kv.host_usage().unwrap().cached_blocks > 0);
    kv.free(RequestId(6));
    kv.resize_host_tier(0);
    assert!(!kv.has_host_tier());
    let offloaded = kv.tier_stats().offloaded_blocks;
    admit(&mut kv, &mut mem, 7, &tokens(24, 6 * BS)).unwrap();
    assert_eq!(
        kv.tier_stats().offloaded_blocks,
        offloaded,
        "no host tier: evictions are dropped"
    );
    kv.free(RequestId(7));
    assert_eq!(kv.usage().used_blocks, 0);
    kv.check_invariants().unwrap();
}

#[test]
fn fork_shares_full_blocks_and_copies_the_partial_one_on_write() {
    let (mut kv, mut mem) = (manager(12, 0), Memory::new(12, 0));
    let (p, c1, c2) = (RequestId(1), RequestId(2), RequestId(3));
    let prompt = tokens(20, 2 * BS + 2);
    let n = prompt.len();
    // The parent computed all but the last prompt token; both children fork there.
    kv.allocate_slots(p, 0, n - 1).unwrap();
    mem.write(kv.block_table(p), &prompt, 0, n - 1);
    kv.cache_computed_blocks(p, &prompt, n - 1);
    kv.fork(p, c1);
    kv.fork(p, c2);
    let parent_table = kv.block_table(p).to_vec();
    assert!(parent_table.iter().all(|&b| kv.pool().ref_count(b) == 3));
    let parent_bytes: Vec<Option<u32>> = parent_table
        .iter()
        .flat_map(|&b| mem.device[b as usize * BS..(b as usize + 1) * BS].to_vec())
        .collect();
    // Each sequence now writes its own token at n - 1: the shared partial block is copied by
    // the first two writers; the last finds it alone and writes in place.
    let mut own = HashMap::new();
    for (i, id) in [c1, c2, p].into_iter().enumerate() {
        let mut toks = prompt.clone();
        toks[n - 1] = 31_000 + i as u32;
        kv.allocate_slots(id, n - 1, 1).unwrap();
        mem.apply(&kv.take_copies());
        mem.write(kv.block_table(id), &toks, n - 1, n);
        own.insert(id, toks);
    }
    assert_eq!(kv.tier_stats().cow_blocks, 2);
    assert_eq!(
        kv.block_table(p),
        parent_table,
        "the parent keeps its table"
    );
    let last = (n - 1) / BS;
    for id in [c1, c2] {
        let t = kv.block_table(id);
        assert_eq!(t[..last], parent_table[..last], "full blocks stay shared");
        assert_ne!(t[last], parent_table[last]);
        assert_eq!(kv.pool().ref_count(t[last]), 1);
    }
    for (id, toks) in &own {
        mem.check(*id, kv.block_table(*id), toks, n);
    }
    // The parent's blocks hold what they held, except the slot it wrote itself.
    let after: Vec<Option<u32>> = parent_table
        .iter()
        .flat_map(|&b| mem.device[b as usize * BS..(b as usize + 1) * BS].to_vec())
        .collect();
    for (i, (a, b)) in parent_bytes.iter().zip(&after).enumerate() {
        if i != n - 1 {
            assert_eq!(a, b, "parent slot {i}");
        }
    }
    for id in [p, c1, c2] {
        kv.free(id);
    }
    assert_eq!(kv.usage().used_blocks, 0);
    kv.check_invariants().unwrap();
}

/// Admissions, growth, frees, swaps and forks at random in small pools, copies applied in
/// order: every held table reads back its own tokens, and nothing leaks in either tier.
#[test]
fn random_tiers_keep_contents_and_counts_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(91);
    let (mut kv, mut mem) = (manager(24, 16), Memory::new(24, 16));
    let prefixes: Vec<Vec<u32>> = (0..3).map(|i| tokens(200 + i, 3 * BS)).collect();
    let mut live: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut swapped: HashMap<RequestId, Vec<u32>> = HashMap::new();
    for step in 0..3000u64 {
        let id = RequestId(step);
        match rng.random_range(0..6) {
            0 => {
                let mut toks = prefixes[rng.random_range(0..3)].clone();
                toks.truncate(rng.random_range(1..=3 * BS));
                toks.extend(tokens(step, rng.random_range(1..12)));
                if admit(&mut kv, &mut mem, step, &toks).is_some() {
                    live.insert(id, toks);
                } else {
                    kv.free(id);
                }
            }
            1 | 2 if !live.is_empty() => {
                let ids: Vec<RequestId> = live.keys().copied().collect();
                let id = ids[rng.random_range(0..ids.len())];
                let toks = live.get_mut(&id).unwrap();
                let n = toks.len();
                toks.push(rng.random_range(3..32_000));
                if kv.allocate_slots(id, n, 1).is_some() {
                    mem.apply(&kv.take_copies());
                    mem.write(kv.block_table(id), toks, n, n + 1);
                    kv.cache_computed_blocks(id, toks, n + 1);
                } else {
                    toks.pop();
                }
            }
            3 if !live.is_empty() => {
                let ids: Vec<RequestId> = live.keys().copied().collect();
                let id = ids[rng.random_range(0..ids.len())];
                if rng.random_bool(0.5) {
                    let toks = live.remove(&id).unwrap();
                    if kv.swap_out(id) {
                        mem.apply(&kv.take_copies());
                        swapped.insert(id, toks);
                    } else {
                        kv.free(id);
                    }
                } else {
                    // Fork: the child takes the parent's tokens and table.
                    let toks = live[&id].clone();
                    let child = RequestId(1_000_000 + step);
                    kv.fork(id, child);
                    live.insert(child, toks);
                }
            }
            4 if !swapped.is_empty() => {
                let ids: Vec<RequestId> = swapped.keys().copied().collect();
                let id = ids[rng.random_range(0..ids.len())];
                if kv.swap_in(id) {
                    mem.apply(&kv.take_copies());
                    live.insert(id, swapped.remove(&id).unwrap());
                }
            }
            _ => {
                let pool = if rng.random_bool(0.5) {
                    &mut live
                } else {
                    &mut swapped
                };
                if let Some(&id) = pool.keys().next() {
                    pool.remove(&id);
                    kv.free(id);
                }
            }
        }
        assert!(kv.take_copies().is_empty(), "copies are taken as planned");
        kv.check_invariants().unwrap();
        for (id, toks) in &live {
            mem.check(*id, kv.block_table(*id), toks, toks.len());
        }
    }
    for id in live.keys().chain(swapped.keys()) {
        kv.free(*id);
    }
    assert_eq!(kv.usage().used_blocks, 0);
    assert_eq!(kv.host_usage().unwrap().used_blocks, 0);
    let st = kv.tier_stats();
    assert!(st.swapped_in_requests > 0 && st.offloaded_blocks > 0 && st.cow_blocks > 0);
    assert!(kv.prefix_cache_stats().host_hit_tokens > 0);
    kv.check_invariants().unwrap();
}
