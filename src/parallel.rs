//! Tensor parallelism's collectives: the `Communicator` a rank's forward calls after its
//! row-parallel projections (all-reduce) and its vocabulary slice of the logits (all-gather),
//! and `ThreadComm`, a world of ranks on threads of one process (the CPU executor's ranks). A
//! GPU world needs the same two collectives over device buffers: the CUDA executor stages them
//! through the host over a `ThreadComm` (`executor::cuda::collective`); NCCL is not built.
//!
//! The sums are deterministic: every rank adds the ranks' buffers in rank order, so every rank
//! ends with the same bits (the ranks' replicated state, the residual stream, never drifts
//! apart) and a step repeats exactly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tensor-parallel collective aborted: {0}")]
pub struct CommAborted(pub String);

/// One rank's end of a world of `world_size` ranks. Every rank must make the same calls in the
/// same order with buffers of the same length (they all run the same step).
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Replaces `x` on every rank by the elementwise sum of the ranks' `x`.
    fn all_reduce_sum(&self, x: &mut [f32]) -> Result<(), CommAborted>;
    /// Sets `out` on every rank to the ranks' `x` concatenated in rank order.
    fn all_gather(&self, x: &[f32], out: &mut Vec<f32>) -> Result<(), CommAborted>;
    /// Fails every call in progress or to come, on every rank: a rank that cannot reach the
    /// next collective (it panicked) releases the ones waiting for it.
    fn abort(&self, why: &str);
}

/// A world of ranks on threads of one process: each rank posts its buffer into its slot, and
/// after a barrier every rank reads all slots. Two sets of slots, used by turns: a rank writes
/// one set only after the barrier of the exchange that used the other, which every rank reaches
/// only once it has read this set's last contents, so one barrier an exchange suffices.
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Exchanges this rank has made (the same count on every rank): its parity picks the set.
    exchanges: AtomicU64,
}

struct Shared {
    world: usize,
    slots: [Vec<Mutex<Vec<f32>>>; 2],
    sync: Mutex<Phase>,
    turned: Condvar,
}

struct Phase {
    arrived: usize,
    /// Barriers passed so far: a waiter leaves when it moves.
    generation: u64,
    aborted: Option<String>,
}

impl ThreadComm {
    /// The `world` ranks' ends, rank i at index i.
    pub fn world(world: usize) -> Vec<ThreadComm> {
        assert!(world > 0, "a world has at least one rank");
        let shared = Arc::new(Shared {
            world,
            slots: [0, 1].map(|_| (0..world).map(|_| Mutex::new(Vec::new())).collect()),
            sync: Mutex::new(Phase {
                arrived: 0,
                generation: 0,
                aborted: None,
            }),
            turned: Condvar::new(),
        });
        (0..world)
            .map(|rank| ThreadComm {
                rank,
                shared: shared.clone(),
                exchanges: AtomicU64::new(0),
            })
            .collect()
    }

    /// A handle that aborts this world (`Communicator::abort`) from outside its ranks: the
    /// owner of a world releases ranks waiting in a collective before it joins their threads.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            shared: self.shared.clone(),
        }
    }

    /// Waits until every rank has arrived (or the world is aborted).
    fn barrier(&self) -> Result<(), CommAborted> {
        let s = &self.shared;
        let mut phase = lock(&s.sync);
        if let Some(why) = &phase.aborted {
            return Err(CommAborted(why.clone()));
        }
        phase.arrived += 1;
        if phase.arrived == s.world {
            phase.arrived = 0;
            phase.generation += 1;
            s.turned.notify_all();
            return Ok(());
        }
        let generation = phase.generation;
        while phase.generation == generation && phase.aborted.is_none() {
            phase = s.turned.wait(phase).unwrap_or_else(|p| p.into_inner());
        }
        match (phase.generation == generation, &phase.aborted) {
            (true, Some(why)) => Err(CommAborted(why.clone())),
            _ => Ok(()),
        }
    }

    /// Posts `x` into this rank's slot of this exchange's set and waits for every rank's;
    /// returns the set, whose slots (rank order) the caller reads.
    fn exchange(&self, x: &[f32]) -> Result<&[Mutex<Vec<f32>>], CommAborted> {
        let set = &self.shared.slots[(self.exchanges.fetch_add(1, Ordering::Relaxed) % 2) as usize];
        {
            let mut slot = lock(&set[self.rank]);
            slot.clear();
            slot.extend_from_slice(x);
        }
        self.barrier()?;
        Ok(set)
    }
}

/// Aborts a `ThreadComm` world (`ThreadComm::abort_handle`).
#[derive(Clone)]
pub struct AbortHandle {
    shared: Arc<Shared>,
}

impl AbortHandle {
    pub fn abort(&self, why: &str) {
        self.shared.abort(why);
    }
}

impl Shared {
    fn abort(&self, why: &str) {
        let mut phase = lock(&self.sync);
        phase.aborted.get_or_insert_with(|| why.to_owned());
        self.turned.notify_all();
    }
}

/// A poisoned lock only means another rank panicked while holding it; the data is plain floats
/// and the abort flag reports the panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_sum(&self, x: &mut [f32]) -> Result<(), CommAborted> {
        if self.shared.world == 1 {
            return Ok(());
        }
        let set = self.exchange(x)?;
        for (r, slot) in set.iter().enumerate() {
            let s = lock(slot);
            assert_eq!(s.len(), x.len(), "all-reduce buffers differ in length");
            match r {
                0 => x.copy_from_slice(&s),
                _ => x.iter_mut().zip(s.iter()).for_each(|(a, b)| *a += b),
            }
        }
        Ok(())
    }

    fn all_gather(&self, x: &[f32], out: &mut Vec<f32>) -> Result<(), CommAborted> {
        out.clear();
        if self.shared.world == 1 {
            out.extend_from_slice(x);
            return Ok(());
        }
        for slot in self.exchange(x)? {
            let s = lock(slot);
            assert_eq!(s.len(), x.len(), "all-gather buffers differ in length");
            out.extend_from_slice(&s);
        }
        Ok(())
    }

    fn abort(&self, why: &str) {
        self.shared.abort(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on every rank of a `world`-rank group, each on its own thread; returns the
    /// ranks' results in rank order.
    fn on_ranks<T: Send>(world: usize, f: impl Fn(ThreadComm) -> T + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let handles: Vec<_> = ThreadComm::world(world)
                .into_iter()
                .map(|c| s.spawn(|| f(c)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Rank r's buffer: values no two ranks share, so a wrong slot or order shows.
    fn buffer(rank: usize, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (rank * 1000 + i) as f32 * 0.37 + 0.1)
            .collect()
    }

    #[test]
    fn all_reduce_gives_every_rank_the_rank_ordered_sum() {
        for world in [1, 2, 3, 4] {
            let len = 37;
            let want: Vec<f32> = (0..len)
                .map(|i| (0..world).fold(0f32, |a, r| a + buffer(r, len)[i]))
                .collect();
            // Many rounds: the barrier's generations and the slots' reuse.
            let got = on_ranks(world, |c| {
                let mut last = Vec::new();
                for round in 0..50 {
                    let mut x = buffer(c.rank(), len);
                    c.all_reduce_sum(&mut x).unwrap();
                    if round > 0 {
                        assert_eq!(x, last, "round {round} differs");
                    }
                    last = x;
                }
                last
            });
            for (r, x) in got.iter().enumerate() {
                assert_eq!(x, &want, "world {world} rank {r}");
            }
        }
    }

    #[test]
    fn all_gather_concatenates_in_rank_order() {
        let len = 5;
        let got = on_ranks(3, |c| {
            let mut out = vec![f32::NAN; 2];
            for _ in 0..20 {
                c.all_gather(&buffer(c.rank(), len), &mut out).unwrap();
            }
            out
        });
        let want: Vec<f32> = (0..3).flat_map(|r| buffer(r, len)).collect();
        for x in got {
            assert_eq!(x, want);
        }
    }

    #[test]
    fn abort_releases_the_ranks_waiting_and_fails_later_calls() {
        let got = on_ranks(3, |c| match c.rank() {
            // Rank 2 never reaches the collective: it aborts instead (as a rank that panicked).
            2 => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                c.abort("rank 2 failed");
                Err(CommAborted("rank 2 failed".into()))
            }
            _ => c.all_reduce_sum(&mut [1.0, 2.0]),
        });
        for r in got {
            assert_eq!(r, Err(CommAborted("rank 2 failed".into())));
        }
        let world = ThreadComm::world(2);
        world[0].abort("first");
        world[1].abort("second");
        assert_eq!(
            world[1].all_gather(&[1.0], &mut Vec::new()),
            Err(CommAborted("first".into())),
            "the first reason stays"
        );
    }

    #[test]
    fn a_world_of_one_is_the_identity() {
        let c = ThreadComm::world(1).pop().unwrap();
        let mut x = vec![1.5, -2.0];
        c.all_reduce_sum(&mut x).unwrap();
        assert_eq!(x, [1.5, -2.0]);
        let mut out = Vec::new();
        c.all_gather(&x, &mut out).unwrap();
        assert_eq!(out, x);
    }
}
