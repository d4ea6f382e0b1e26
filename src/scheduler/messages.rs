//! What sessions (through `EngineCore`) send the scheduler actor.

use std::time::Instant;

use actix::Message;
use tokio::sync::mpsc;

use crate::request::{RequestId, StreamEvent};
use crate::validation::ValidRequest;

/// A new, validated request. Its events (`overloaded` too) go to `tx`, a bounded channel.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submit {
    pub id: RequestId,
    pub request: ValidRequest,
    pub tx: mpsc::Sender<StreamEvent>,
    pub arrival: Instant,
}

/// The client cancelled: the request ends with `done` / `cancelled`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cancel {
    pub id: RequestId,
}

/// The client went away: drop the requests silently and free their blocks.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Abort {
    pub ids: Vec<RequestId>,
}
