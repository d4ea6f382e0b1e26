//! The TCP connection under a WebSocket, for what actix does not offer: a send-buffer size, and
//! cutting the connection of a client that stopped reading.
//!
//! Why a cut is needed: actix-web-actors runs the session only while the HTTP dispatcher polls the
//! response body, and the dispatcher stops polling it while its write buffer waits on a socket the
//! client does not drain. A frozen session cannot close its socket, and no actix timer covers a
//! stalled write. So [`on_connect`] records each connection's file descriptor; once the session's
//! unread output passed its limit (`output::backlog`) and the grace period went by, the session's
//! [`Watchdog`] shuts the socket down (`shutdown(2)`): the dispatcher's pending write fails, the
//! connection ends, and the session stops, freeing its slot.

use std::any::Any;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Extensions;

use crate::metrics::Metrics;
use crate::output::Backlog;

/// The raw descriptor of an accepted connection, in the request's connection data.
#[derive(Debug, Clone, Copy)]
pub struct ConnSocket {
    #[cfg(unix)]
    fd: std::os::fd::RawFd,
}

/// `HttpServer::on_connect` hook: sets SO_SNDBUF (`send_buffer` bytes, 0 = leave it) and keeps
/// the descriptor for the session.
pub fn on_connect(
    send_buffer: usize,
) -> impl Fn(&dyn Any, &mut Extensions) + Send + Sync + 'static {
    move |conn, ext| {
        #[cfg(unix)]
        if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
            use std::os::fd::AsRawFd;
            if send_buffer > 0 {
                if let Err(e) = socket2::SockRef::from(tcp).set_send_buffer_size(send_buffer) {
                    tracing::warn!("cannot set SO_SNDBUF to {send_buffer}: {e}");
                }
            }
            ext.insert(ConnSocket {
                fd: tcp.as_raw_fd(),
            });
        }
        #[cfg(not(unix))]
        let _ = (conn, ext, send_buffer);
    }
}

/// Ends a slow consumer's connection if its session does not: armed when the session starts,
/// it waits (a task on the session's worker, asleep until woken) for the backlog to pass its
/// limit, then for the grace period, then shuts the socket down. Dropped with the session, it
/// aborts its task, so it never touches a descriptor that a later connection may reuse.
pub struct Watchdog {
    task: actix_rt::task::JoinHandle<()>,
    /// Alive as long as the session: the task checks it before the cut.
    _alive: Rc<()>,
}

impl Watchdog {
    pub fn start(
        backlog: Arc<Backlog>,
        grace: Duration,
        conn: Option<ConnSocket>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let alive = Rc::new(());
        let weak: Weak<()> = Rc::downgrade(&alive);
        let task = actix_rt::spawn(async move {
            backlog.tripped().await;
            actix_rt::time::sleep(grace).await;
            // Single-threaded worker: while the session lives, so does its connection (the
            // dispatcher owns both), so the descriptor is still this connection's.
            if weak.upgrade().is_none() {
                return;
            }
            tracing::warn!(
                unread = backlog.bytes(),
                "slow consumer did not read within {grace:?}: cutting the connection"
            );
            metrics
                .ws_closes
                .with_label_values(&["slow_consumer_cut"])
                .inc();
            if let Some(c) = conn {
                c.shutdown();
            }
        });
        Watchdog {
            task,
            _alive: alive,
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ConnSocket {
    fn shutdown(self) {
        #[cfg(unix)]
        {
            // SAFETY: the descriptor is open and still this connection's: the watchdog only
            // gets here while its session lives, and the session lives inside the connection's
            // dispatcher, which owns (and closes) the descriptor. Shutting a socket down does
            // not close the descriptor, so the dispatcher still closes it exactly once.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
            if let Err(e) = socket2::SockRef::from(&fd).shutdown(std::net::Shutdown::Both) {
                tracing::debug!("shutdown of a slow consumer's socket: {e}");
            }
        }
    }
}
