//! One HTTP/2 connection to a backend unix socket (containerd's gRPC socket), shared by every call
//! and re-established when it breaks.
//!
//! The connection is made lazily, on the first call that needs it, so the proxy serves even while
//! the runtime is not up yet: those calls fail `UNAVAILABLE` with a message naming the socket, and
//! the first call after the runtime appears connects. HTTP/2 multiplexes every concurrent call on
//! the one connection, as kubelet's own client does.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

use crate::body::ProxyBody;
use crate::grpc::{Code, Status};

/// Largest header block accepted from the backend: 16 MiB, grpc-go's default (so metadata the
/// runtime can send reaches kubelet).
pub const MAX_HEADER_LIST_SIZE: u32 = 16 << 20;

/// A lazily connected, self-healing HTTP/2 client for one backend socket.
pub struct Backend {
    path: PathBuf,
    /// The live connection, if any. Held only to clone the sender (never across an await).
    conn: Mutex<Option<SendRequest<ProxyBody>>>,
    /// Serialises connection attempts so a burst of calls after a failure dials once.
    connecting: tokio::sync::Mutex<()>,
}

impl Backend {
    /// A backend for the unix socket at `path`; nothing is dialled until the first call.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Backend { path: path.into(), conn: Mutex::new(None), connecting: tokio::sync::Mutex::new(()) }
    }

    /// The backend socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one request and returns the backend's response head with its body still streaming.
    ///
    /// If the shared connection turns out to be closed before the request was written, the
    /// request is retried once on a fresh connection (it never reached the backend, so this is
    /// safe for every method).
    ///
    /// Errors: `UNAVAILABLE` naming the socket when it cannot be dialled or the connection breaks
    /// before a response head arrives.
    pub async fn send(&self, req: Request<ProxyBody>) -> Result<Response<Incoming>, Status> {
        let mut sender = self.sender().await?;
        match sender.try_send_request(req).await {
            Ok(resp) => Ok(resp),
            Err(mut e) => {
                self.forget(&sender);
                match e.take_message() {
                    Some(req) => {
                        let mut sender = self.sender().await?;
                        sender.send_request(req).await.map_err(|e| {
                            self.forget(&sender);
                            self.unavailable("call failed", &e)
                        })
                    }
                    None => Err(self.unavailable("call failed", e.error())),
                }
            }
        }
    }

    /// Dials now, so a caller can learn whether the backend is up (start-up checks, health).
    ///
    /// Errors: as [`Backend::send`].
    pub async fn connect(&self) -> Result<(), Status> {
        self.sender().await.map(drop)
    }

    async fn sender(&self) -> Result<SendRequest<ProxyBody>, Status> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _guard = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let stream = UnixStream::connect(&self.path).await.map_err(|e| self.unavailable("cannot connect", &e))?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .initial_stream_window_size(crate::server::STREAM_WINDOW)
            .initial_connection_window_size(crate::server::CONNECTION_WINDOW)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.unavailable("HTTP/2 handshake failed", &e))?;
        let path = self.path.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::warn!(backend = %path.display(), error = %e, "backend connection closed");
            }
        });
        tracing::info!(backend = %self.path.display(), "connected to backend");
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender.clone());
        Ok(sender)
    }

    fn live(&self) -> Option<SendRequest<ProxyBody>> {
        let guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    /// Drops the shared connection if it is still `broken`, so the next call dials afresh.
    fn forget(&self, broken: &SendRequest<ProxyBody>) {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.as_ref().is_some_and(|s| s.is_closed() || broken.is_closed()) {
            *guard = None;
        }
    }

    fn unavailable(&self, what: &str, err: &dyn std::fmt::Display) -> Status {
        Status::new(Code::UNAVAILABLE, format!("backend unix://{}: {what}: {err}", self.path.display()))
    }
}
