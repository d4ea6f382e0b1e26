//! The scheduler's bookkeeping invariants, checked around every step by the tests.

use super::Scheduler;
use crate::kv::KvCacheManager;
use crate::scheduler::request::Status;

impl Scheduler {
    /// Queue and bookkeeping invariants, against the KV manager's tables.
    pub(crate) fn check_invariants(&self, kv: &KvCacheManager) -> Result<(), String> {
        if self.running.len() > self.cfg.max_num_seqs {
            return Err(format!("{} running > max_num_seqs", self.running.len()));
        }
        if self.running.len() + self.waiting.len() != self.requests.len() {
            return Err("queues and request map disagree".into());
        }
        if self.slots_used() > self.cfg.max_num_seqs {
            return Err(format!("{} slots used > max_num_seqs", self.slots_used()));
        }
        let reserved: usize = self
            .running
            .iter()
            .map(|id| self.requests[id].pending_fork)
            .sum();
        if reserved != self.fork_reserved {
            return Err(format!(
                "{} fork slots reserved, running parents hold {reserved}",
                self.fork_reserved
            ));
        }
        for id in &self.waiting {
            let req = &self.requests[id];
            if req.status != Status::Waiting || req.num_computed != 0 || req.loading {
                return Err(format!("{id}: waiting with status {:?}", req.status));
            }
            if !kv.block_table(*id).is_empty() || req.executor_blocks.is_some() {
                return Err(format!("{id}: waiting but holds blocks"));
            }
            if req.swapped_computed.is_some() != kv.is_swapped(*id) {
                return Err(format!("{id}: swapped state differs from the KV manager's"));
            }
        }
        for id in &self.running {
            let req = &self.requests[id];
            if req.status != Status::Running {
                return Err(format!("{id}: running with status {:?}", req.status));
            }
            if kv.block_table(*id).len() * kv.block_size() < req.num_computed {
                return Err(format!("{id}: blocks do not cover its computed tokens"));
            }
            if kv.is_swapped(*id) || req.swapped_computed.is_some() {
                return Err(format!("{id}: running but swapped"));
            }
            // None: the executor holds nothing for it (loading from the host tier, or loaded
            // and not scheduled since): its next step sends its whole state.
            if req.loading && req.executor_blocks.is_some() {
                return Err(format!("{id}: loading but the executor holds its state"));
            }
            if req
                .executor_blocks
                .is_some_and(|b| b != kv.block_table(*id).len())
            {
                return Err(format!(
                    "{id}: executor holds {:?} blocks of {}",
                    req.executor_blocks,
                    kv.block_table(*id).len()
                ));
            }
        }
        Ok(())
    }
}
