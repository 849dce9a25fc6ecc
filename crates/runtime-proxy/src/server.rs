//! The accept loop: serves each client connection (gRPC over HTTP/2, prior knowledge, as kubelet
//! connects) on the listening socket with a [`crate::relay`], and drains on shutdown.
//!
//! Shutdown: stop accepting, remove the socket (new clients fail fast instead of hanging), send
//! GOAWAY on every connection, wait up to the drain timeout for in-flight calls and streams.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::router::Router;

/// Serves `listener` until `shutdown` resolves, then removes the socket at `socket_path` and
/// drains for at most `drain_timeout`. At most `max_streams` calls run at once on one client
/// connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; the client holds back the rest).
///
/// Errors: none so far (accept errors are logged and retried); the `Result` leaves room for the
/// admin endpoint's bind errors.
pub async fn serve(
    listener: UnixListener,
    socket_path: &Path,
    router: Arc<Router>,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
    max_streams: u32,
) -> anyhow::Result<()> {
    accept_and_drain(listener, socket_path, shutdown, drain_timeout, |stream, stop, tasks| {
        crate::relay::serve_connection(stream, router.clone(), tasks, stop, max_streams)
    })
    .await;
    Ok(())
}

/// The accept loop both front ends share (CRI here, Docker in [`crate::docker`]): each accepted
/// connection runs `serve_conn(stream, stop, tasks)` as a task of `tasks` (where it may spawn
/// per-call tasks too; `stop` turns true at shutdown, when it should finish what is in flight and
/// close). When `shutdown` resolves: stop accepting, remove the socket at `socket_path` (new
/// clients fail fast instead of hanging), signal `stop`, and wait up to `drain_timeout` for the
/// tasks. Accept errors are logged and retried after 50 ms.
pub async fn accept_and_drain<F, Fut>(
    listener: UnixListener,
    socket_path: &Path,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
    mut serve_conn: F,
) where
    F: FnMut(UnixStream, watch::Receiver<bool>, TaskTracker) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let tasks = TaskTracker::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tasks.spawn(serve_conn(stream, stop_rx.clone(), tasks.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if let Err(e) = std::fs::remove_file(socket_path) {
        tracing::warn!(socket = %socket_path.display(), error = %e, "could not remove socket");
    }
    let _ = stop_tx.send(true);
    tasks.close();
    tracing::info!(tasks = tasks.len(), "draining in-flight calls");
    if tokio::time::timeout(drain_timeout, tasks.wait()).await.is_err() {
        tracing::warn!(?drain_timeout, open = tasks.len(), "drain timeout reached; exiting with calls still open");
    }
}
