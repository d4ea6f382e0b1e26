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
        for id in &self.waiting {
            let req = &self.requests[id];
            if req.status != Status::Waiting || req.num_computed != 0 {
                return Err(format!("{id}: waiting with status {:?}", req.status));
            }
            if !kv.block_table(*id).is_empty() || req.executor_blocks.is_some() {
                return Err(format!("{id}: waiting but holds blocks"));
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
            if req.executor_blocks != Some(kv.block_table(*id).len()) {
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
