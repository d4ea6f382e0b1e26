//! What sessions (through `EngineCore`) and the server's shutdown send the scheduler actor.

use std::sync::Arc;
use std::time::Instant;

use actix::Message;
use tokio::sync::{mpsc, oneshot};

use crate::error::EngineError;
use crate::output::Backlog;
use crate::request::{RequestId, StreamEvent};
use crate::validation::ValidRequest;

/// A new, validated request. Its events (`overloaded` too) go to `tx`, a bounded channel.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submit {
    pub id: RequestId,
    pub request: ValidRequest,
    pub tx: mpsc::Sender<StreamEvent>,
    /// The socket's unread output, for a WebSocket session's request.
    pub backlog: Option<Arc<Backlog>>,
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

/// Answers on `0` once no request is left (at once when none is): a drain waits on it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WhenIdle(pub oneshot::Sender<()>);

/// Ends every request with this error and frees its blocks (a drain's deadline passed).
#[derive(Message)]
#[rtype(result = "()")]
pub struct FailAll(pub EngineError);

/// Ends every request left with `shutting_down`, then has the executor drop its backend on its
/// thread; answers once the backend is gone (`EngineCore::shutdown`, before the process exits).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;
