//! One HTTP/2 connection to a backend unix socket (containerd's gRPC socket), shared by every call
//! and re-established when it breaks.
//!
//! The connection is made lazily, on the first call that needs it, so the proxy serves even while
//! the runtime is not up yet: those calls fail `UNAVAILABLE` with a message naming the socket, and
//! the first call after the runtime appears connects. HTTP/2 multiplexes every concurrent call on
//! the one connection, as kubelet's own client does.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::SendStream;
use http::Request;
use tokio::net::UnixStream;

use crate::grpc::{Code, Status};
use crate::uds::Socket;

/// Largest header block accepted, from kubelet and from the backend: 16 MiB, grpc-go's default
/// (so any metadata one side can send reaches the other).
pub const MAX_HEADER_LIST_SIZE: u32 = 16 << 20;
/// HTTP/2 per-stream receive window (bytes), on both sides: large enough that a 16 MiB
/// ListContainers answer needs few window updates.
pub const STREAM_WINDOW: u32 = 4 << 20;
/// HTTP/2 per-connection receive window (bytes), on both sides.
pub const CONNECTION_WINDOW: u32 = 16 << 20;

/// A lazily connected, self-healing HTTP/2 client for one backend socket.
pub struct Backend {
    path: PathBuf,
    /// The live connection, if any. Held only to clone the sender (never across an await).
    conn: Mutex<Option<SendRequest<Bytes>>>,
    /// Serialises connection attempts so a burst of calls after a failure dials once.
    connecting: tokio::sync::Mutex<()>,
    /// Counts connections made (1 = the first; more = reconnections, e.g. after the runtime
    /// restarted), for the store's recovery.
    connections: tokio::sync::watch::Sender<u64>,
}

impl Backend {
    /// A backend for the unix socket at `path`; nothing is dialled until the first call.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Backend {
            path: path.into(),
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            connections: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The backend socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens one stream: sends the request head (with END_STREAM when `end_of_stream`), returns
    /// the future of the response head and the stream's send half for the request body.
    ///
    /// A connection found closed before the head was sent is replaced once (the request never
    /// reached the backend, so this is safe for every method).
    ///
    /// Errors: `UNAVAILABLE` naming the socket when it cannot be dialled or the connection fails.
    pub async fn open_stream(&self, head: Request<()>, end_of_stream: bool) -> Result<(ResponseFuture, SendStream<Bytes>), Status> {
        let mut sender = match self.sender().await?.ready().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(backend = %self.path.display(), error = %e, "backend connection unusable; reconnecting");
                self.forget();
                self.sender().await?.ready().await.map_err(|e| self.unavailable("connection failed", &e))?
            }
        };
        sender.send_request(head, end_of_stream).map_err(|e| {
            self.forget();
            self.unavailable("call failed", &e)
        })
    }

    /// Notified with the number of connections made so far, each time a new one is made.
    pub fn connections(&self) -> tokio::sync::watch::Receiver<u64> {
        self.connections.subscribe()
    }

    /// Dials now, so a caller can learn whether the backend is up (start-up checks, health).
    ///
    /// Errors: as [`Backend::open_stream`].
    pub async fn connect(&self) -> Result<(), Status> {
        self.sender().await.map(drop)
    }

    async fn sender(&self) -> Result<SendRequest<Bytes>, Status> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _guard = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let stream = UnixStream::connect(&self.path).await.and_then(Socket::new).map_err(|e| self.unavailable("cannot connect", &e))?;
        let (sender, conn) = h2::client::Builder::new()
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake(stream)
            .await
            .map_err(|e| self.unavailable("HTTP/2 handshake failed", &e))?;
        let path = self.path.clone();
        tokio::spawn(async move {
            match conn.await {
                Ok(()) => tracing::info!(backend = %path.display(), "backend connection closed"),
                Err(e) => {
                    tracing::warn!(backend = %path.display(), error = %e, "backend connection broken")
                }
            }
        });
        tracing::info!(backend = %self.path.display(), "connected to backend");
        self.connections.send_modify(|n| *n += 1);
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender.clone());
        Ok(sender)
    }

    fn live(&self) -> Option<SendRequest<Bytes>> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Drops the shared connection so the next call dials afresh.
    fn forget(&self) {
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn unavailable(&self, what: &str, err: &dyn std::fmt::Display) -> Status {
        Status::new(Code::UNAVAILABLE, format!("backend unix://{}: {what}: {err}", self.path.display()))
    }
}
