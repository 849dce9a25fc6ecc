//! The accept loop: serves each client connection (gRPC over HTTP/2, prior knowledge, as kubelet
//! connects) on the listening socket with a [`crate::cri::relay`], and drains on shutdown.
//!
//! Shutdown: stop accepting, remove the socket (new clients fail fast instead of hanging), send
//! GOAWAY on every connection, wait up to the drain timeout for in-flight calls and streams.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;

use crate::cri::router::Router;

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
    crate::listener::accept_and_drain(listener, socket_path, shutdown, drain_timeout, |stream, stop, tasks| {
        crate::cri::relay::serve_connection(stream, router.clone(), tasks, stop, max_streams)
    })
    .await;
    Ok(())
}
