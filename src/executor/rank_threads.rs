//! The peer ranks of a tensor-parallel world (ranks 1..N; rank 0 is the backend's own, on the
//! executor thread), each on a thread of its own that owns its state (a model shard and its KV
//! pools, or a whole CUDA backend) and runs one job at a time: the CPU executor's and the CUDA
//! executor's worlds (`cpu::tp`, `cuda::tp`) differ only in the state and the jobs.
//!
//! A job that fails or panics aborts the world (`AbortHandle`), which releases the ranks
//! waiting for this one in a collective; the caller learns of it from `collect` and panics, so
//! the executor actor rebuilds the backend. Dropping the threads aborts the world, closes the
//! channels and joins them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;

use anyhow::Context;
use crossbeam_channel::{bounded, Receiver, Sender};

use crate::executor::actor::panic_message;
use crate::parallel::{AbortHandle, CommAborted};

/// How a peer's job ended.
enum Done {
    Ok,
    /// `aborted`: the failure was another rank's abort reaching this one.
    Failed {
        why: String,
        aborted: bool,
    },
    Panicked(String),
}

/// A peer's failed job: why, and whether it failed on its own (`cause`) rather than because
/// another rank aborted the world.
#[derive(Debug)]
pub struct Failure {
    pub cause: bool,
    pub why: String,
}

/// One peer rank's thread and its two channels (one job in flight at a time: bounded at 1).
struct Peer<J> {
    rank: usize,
    jobs: Sender<J>,
    done: Receiver<Done>,
    thread: JoinHandle<()>,
}

/// Ranks 1..N of a world, running jobs of type `J`.
pub struct RankThreads<J> {
    peers: Vec<Peer<J>>,
    abort: AbortHandle,
}

impl<J: Send + 'static> RankThreads<J> {
    /// No peers yet; `abort` is the world's.
    pub fn new(abort: AbortHandle) -> Self {
        RankThreads {
            peers: Vec::new(),
            abort,
        }
    }

    /// Ranks in the world, rank 0 included.
    pub fn world_size(&self) -> usize {
        self.peers.len() + 1
    }

    /// Starts rank `rank`'s thread: `build` makes its state there (a CUDA context belongs to
    /// the thread that uses it), then each job runs as `run(&mut state, &job)`. Returns once
    /// the state is built, with `build`'s error if it failed (no thread is left running then).
    pub fn spawn<S>(
        &mut self,
        rank: usize,
        build: impl FnOnce() -> anyhow::Result<S> + Send + 'static,
        mut run: impl FnMut(&mut S, &J) -> anyhow::Result<()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (ready_tx, ready) = bounded::<Result<(), String>>(1);
        let (jobs, job_rx) = bounded::<J>(1);
        let (done_tx, done) = bounded(1);
        let abort = self.abort.clone();
        let thread = std::thread::Builder::new()
            .name(format!("brook-tp{rank}"))
            .spawn(move || {
                let built = catch_unwind(AssertUnwindSafe(build))
                    .unwrap_or_else(|p| Err(anyhow::anyhow!("{}", panic_message(&*p))));
                let mut state = match built {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("{e:#}")));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                while let Ok(job) = job_rx.recv() {
                    let end = match catch_unwind(AssertUnwindSafe(|| run(&mut state, &job))) {
                        Ok(Ok(())) => Done::Ok,
                        Ok(Err(e)) => Done::Failed {
                            why: format!("{e:#}"),
                            aborted: e.chain().any(|c| c.is::<CommAborted>()),
                        },
                        Err(p) => Done::Panicked(panic_message(&*p)),
                    };
                    if !matches!(end, Done::Ok) {
                        // The others may be waiting in a collective this rank will not reach.
                        abort.abort("a peer rank failed");
                    }
                    if done_tx.send(end).is_err() {
                        break;
                    }
                }
            })
            .context("starting a tensor-parallel rank's thread")?;
        let up = ready
            .recv()
            .unwrap_or_else(|_| Err("its thread ended while starting".to_owned()));
        match up {
            Ok(()) => {
                self.peers.push(Peer {
                    rank,
                    jobs,
                    done,
                    thread,
                });
                Ok(())
            }
            Err(why) => {
                let _ = thread.join();
                anyhow::bail!("tensor-parallel rank {rank}: {why}")
            }
        }
    }

    /// Hands every peer a job.
    pub fn post(&self, job: impl Fn() -> J) {
        for p in &self.peers {
            // A peer's thread ends only with the channel, or by a bug: `collect` reports it.
            let _ = p.jobs.send(job());
        }
    }

    /// Waits for every peer's job; their failures, those a rank caused first, else in rank
    /// order.
    pub fn collect(&self) -> Vec<Failure> {
        let mut failures = Vec::new();
        for p in &self.peers {
            let (cause, why) = match p.done.recv() {
                Ok(Done::Ok) => continue,
                Ok(Done::Panicked(m)) => (true, format!("rank {} panicked: {m}", p.rank)),
                Ok(Done::Failed { why, aborted }) => (!aborted, format!("rank {}: {why}", p.rank)),
                Err(_) => (true, format!("rank {}'s thread is gone", p.rank)),
            };
            failures.push(Failure { cause, why });
        }
        failures.sort_by_key(|f| !f.cause);
        failures
    }

    /// Runs `job` on every peer and `rank0` here (rank 0's share of the same work), and returns
    /// rank 0's result. Panics when any rank failed, naming the failure that caused the others:
    /// a peer's own, else rank 0's, else any.
    pub fn run<T>(
        &self,
        what: &str,
        job: impl Fn() -> J,
        rank0: impl FnOnce() -> anyhow::Result<T>,
    ) -> T {
        self.post(job);
        let mine = rank0();
        if mine.is_err() {
            self.abort.abort("rank 0 failed");
        }
        let theirs = self.collect();
        match (mine, theirs.first()) {
            (Ok(t), None) => t,
            (_, Some(f)) if f.cause => panic!("tensor-parallel {what} failed: {}", f.why),
            (Err(e), _) => panic!("tensor-parallel {what} failed: rank 0: {e:#}"),
            (Ok(_), Some(f)) => panic!("tensor-parallel {what} failed: {}", f.why),
        }
    }
}

impl<J> Drop for RankThreads<J> {
    /// Releases peers waiting in a collective (rank 0 panicked mid-step), closes their channels
    /// and joins their threads.
    fn drop(&mut self) {
        self.abort.abort("the backend is shutting down");
        for Peer {
            rank,
            jobs,
            done,
            thread,
        } in self.peers.drain(..)
        {
            drop((jobs, done));
            if thread.join().is_err() {
                tracing::error!("tensor-parallel rank {rank}'s thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::parallel::ThreadComm;

    fn threads() -> RankThreads<u32> {
        let world = ThreadComm::world(3);
        RankThreads::new(world[0].abort_handle())
    }

    /// A peer adds its job to `sum`; job 0 fails, job 9 panics.
    fn spawn_counter(t: &mut RankThreads<u32>, rank: usize, sum: &Arc<AtomicU32>) {
        let sum = sum.clone();
        t.spawn(
            rank,
            move || Ok(sum),
            |sum: &mut Arc<AtomicU32>, &job: &u32| match job {
                0 => anyhow::bail!("job zero"),
                9 => panic!("job nine"),
                n => {
                    sum.fetch_add(n, Ordering::Relaxed);
                    Ok(())
                }
            },
        )
        .unwrap();
    }

    #[test]
    fn a_state_that_fails_to_build_fails_the_spawn_and_leaves_no_peer() {
        let mut t = threads();
        let err = t
            .spawn(
                1,
                || -> anyhow::Result<u32> { anyhow::bail!("no GPU") },
                |_, _| Ok(()),
            )
            .unwrap_err();
        assert_eq!(format!("{err:#}"), "tensor-parallel rank 1: no GPU");
        let err = t
            .spawn(
                2,
                || -> anyhow::Result<u32> { panic!("boom") },
                |_, _| Ok(()),
            )
            .unwrap_err();
        assert_eq!(format!("{err:#}"), "tensor-parallel rank 2: boom");
        assert_eq!(t.world_size(), 1);
    }

    #[test]
    fn jobs_run_on_every_peer_and_rank_zeros_result_comes_back() {
        let (mut t, sum) = (threads(), Arc::new(AtomicU32::new(0)));
        spawn_counter(&mut t, 1, &sum);
        spawn_counter(&mut t, 2, &sum);
        assert_eq!(t.world_size(), 3);
        assert_eq!(t.run("step", || 5, || Ok(7)), 7);
        assert_eq!(
            sum.load(Ordering::Relaxed),
            10,
            "each peer ran the job once"
        );
        assert!(t.collect_nothing_pending());
    }

    #[test]
    fn a_peers_failure_panics_the_step_naming_it() {
        let mut t = threads();
        spawn_counter(&mut t, 1, &Arc::default());
        let err = catch_unwind(AssertUnwindSafe(|| t.run("step", || 0, || Ok(())))).unwrap_err();
        assert_eq!(
            panic_message(&*err),
            "tensor-parallel step failed: rank 1: job zero"
        );
        let err = catch_unwind(AssertUnwindSafe(|| t.run("step", || 9, || Ok(())))).unwrap_err();
        assert_eq!(
            panic_message(&*err),
            "tensor-parallel step failed: rank 1 panicked: job nine"
        );
    }

    #[test]
    fn rank_zeros_failure_panics_the_step_when_no_peer_caused_it() {
        let mut t = threads();
        spawn_counter(&mut t, 1, &Arc::default());
        let err = catch_unwind(AssertUnwindSafe(|| {
            t.run(
                "step",
                || 1,
                || -> anyhow::Result<()> { anyhow::bail!("bad") },
            )
        }))
        .unwrap_err();
        assert_eq!(
            panic_message(&*err),
            "tensor-parallel step failed: rank 0: bad"
        );
    }

    impl<J: Send + 'static> RankThreads<J> {
        /// No peer has a finished job left unread.
        fn collect_nothing_pending(&self) -> bool {
            self.peers.iter().all(|p| p.done.is_empty())
        }
    }
}
