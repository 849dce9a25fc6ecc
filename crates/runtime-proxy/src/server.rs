//! The accept loop: serves HTTP/2 (gRPC, prior knowledge, as kubelet connects) on the listening
//! socket, hands every request to the [`Router`], and drains on shutdown.
//!
//! Shutdown: stop accepting, remove the socket (new clients fail fast instead of hanging), send
//! GOAWAY on every connection, wait up to the drain timeout for in-flight calls and streams.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::UnixListener;

use crate::backend::MAX_HEADER_LIST_SIZE;
use crate::router::Router;

/// HTTP/2 per-stream receive window (bytes), both towards kubelet and towards the backend: large
/// enough that a 16 MiB ListContainers answer needs few window updates.
pub const STREAM_WINDOW: u32 = 4 << 20;
/// HTTP/2 per-connection receive window (bytes).
pub const CONNECTION_WINDOW: u32 = 16 << 20;

/// Serves `listener` until `shutdown` resolves, then drains for at most `drain_timeout` and
/// removes the socket at `socket_path`.
///
/// Errors: only when accepting on the socket fails for good (per-connection errors are logged).
pub async fn serve(
    listener: UnixListener,
    socket_path: &Path,
    router: Arc<Router>,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
) -> anyhow::Result<()> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .max_header_list_size(MAX_HEADER_LIST_SIZE)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .auto_date_header(false);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let router = router.clone();
                let service = service_fn(move |req| {
                    let router = router.clone();
                    async move { Ok::<_, Infallible>(router.handle(req).await) }
                });
                let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "client connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if let Err(e) = std::fs::remove_file(socket_path) {
        tracing::warn!(socket = %socket_path.display(), error = %e, "could not remove socket");
    }
    tracing::info!(connections = graceful.count(), "draining in-flight calls");
    if tokio::time::timeout(drain_timeout, graceful.shutdown()).await.is_err() {
        tracing::warn!(?drain_timeout, "drain timeout reached; exiting with calls still open");
    }
    Ok(())
}
