//! The KV-block manager actor: a thin wrapper over `KvCacheManager`.
//!
//! Allocation sits on the critical path of every engine step, so the scheduler borrows the
//! manager under an uncontended lock for `schedule()` / `update_from_output()` (as vLLM calls
//! its KV manager inline) instead of a message round trip per sequence. Everything else —
//! usage figures for /metrics and /health, prefix-cache maintenance — goes through this actor.

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, MessageResult};
use parking_lot::Mutex;

use crate::kv::manager::{KvCacheManager, KvUsage};

pub type KvHandle = Arc<Mutex<KvCacheManager>>;

pub struct KvActor {
    kv: KvHandle,
}

impl KvActor {
    pub fn new(kv: KvHandle) -> Self {
        KvActor { kv }
    }
}

impl Actor for KvActor {
    type Context = Context<Self>;
}

/// Current block usage.
pub struct GetKvUsage;

impl Message for GetKvUsage {
    type Result = KvUsage;
}

impl Handler<GetKvUsage> for KvActor {
    type Result = MessageResult<GetKvUsage>;

    fn handle(&mut self, _: GetKvUsage, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.kv.lock().usage())
    }
}
