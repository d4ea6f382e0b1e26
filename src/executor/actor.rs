//! The executor actor: owns the backend on its own thread (a one-thread `SyncArbiter`), so a
//! forward pass never blocks the scheduler's or the sessions' event loops.

use std::sync::Arc;

use actix::{Actor, Handler, Message, SyncContext};

use crate::executor::backend::Backend;
use crate::step::{SchedulerOutput, StepOutput};

pub struct ExecutorActor {
    backend: Box<dyn Backend>,
}

impl ExecutorActor {
    pub fn new(backend: Box<dyn Backend>) -> Self {
        ExecutorActor { backend }
    }
}

impl Actor for ExecutorActor {
    type Context = SyncContext<Self>;
}

/// Run one engine step. The plan is shared (not copied) with the scheduler, which needs it
/// again in `update_from_output`.
pub struct ExecuteStep(pub Arc<SchedulerOutput>);

impl Message for ExecuteStep {
    type Result = Result<StepOutput, String>;
}

impl Handler<ExecuteStep> for ExecutorActor {
    type Result = Result<StepOutput, String>;

    fn handle(&mut self, msg: ExecuteStep, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.backend.execute(&msg.0).map_err(|e| format!("{e:#}"))
    }
}
