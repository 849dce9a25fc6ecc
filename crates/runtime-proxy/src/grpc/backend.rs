//! One HTTP/2 connection to a backend unix socket (containerd's gRPC socket), shared by every call
//! and re-established when it breaks.
//!
//! # Connecting
//!
//! The connection is made lazily, on the first call that needs it, so the proxy serves even while
//! the runtime is not up yet: those calls fail `UNAVAILABLE` with a message naming the socket, and
//! the first call after the runtime appears connects. HTTP/2 multiplexes every concurrent call on
//! the one connection, as kubelet's own client does.
//!
//! Hook servers have a client of their own ([`crate::grpc::hook_client`]).
//!
//! # Lifetime
//!
//! A connection's task ends when the connection does, or at the latest [`CLOSE_GRACE`] after the
//! last handle of its `Backend` is dropped. Every caller holds a handle (or a borrow) for as long
//! as its streams live, so by then no call is left on the connection; the grace lets HTTP/2 send
//! its GOAWAY and close cleanly, and the cut-off ends a connection whose peer stopped reading,
//! which would otherwise keep its task, socket and queued frames for ever.

use std::fmt;
use std::future::poll_fn;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::SendStream;
use http::Request;
use tokio::net::UnixStream;

use crate::grpc::{Code, Status};
use daemon_support::uds::Socket;

/// Largest header block accepted, from kubelet and from the backend: 16 MiB, grpc-go's default
/// (so any metadata one side can send reaches the other).
pub const MAX_HEADER_LIST_SIZE: u32 = 16 << 20;
/// HTTP/2 per-stream receive window (bytes), on both sides: large enough that a 16 MiB
/// ListContainers answer needs few window updates.
pub const STREAM_WINDOW: u32 = 4 << 20;
/// HTTP/2 per-connection receive window (bytes), on both sides.
pub const CONNECTION_WINDOW: u32 = 16 << 20;

/// How long a connection may go on closing (sending GOAWAY, flushing) once the last handle of
/// its [`Backend`] is dropped, before its task is aborted and its socket closed: 1 s.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// A lazily connected, self-healing HTTP/2 client for one backend socket.
pub struct Backend {
    path: PathBuf,
    /// Never sent to: dropped with the `Backend`, which tells its connection tasks to close.
    dropped: tokio::sync::watch::Sender<()>,
    /// The live connection, if any. Held only to clone the sender (never across an await).
    conn: Mutex<Option<SendRequest<Bytes>>>,
    /// Serialises connection attempts so a burst of calls after a failure dials once.
    connecting: tokio::sync::Mutex<()>,
    /// Counts connections made (1 = the first; more = reconnections, e.g. after the runtime
    /// restarted), for the store's recovery: the first, and then the first after one was lost.
    connections: tokio::sync::watch::Sender<u64>,
    /// A connection broke since the count last went up (set by the shared connection's task
    /// and by relays, [`Backend::connection_lost`]).
    lost: Arc<AtomicBool>,
}

impl Backend {
    /// A backend for the unix socket at `path`; nothing is dialled until the first call.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Backend {
            path: path.into(),
            dropped: tokio::sync::watch::Sender::new(()),
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            connections: tokio::sync::watch::Sender::new(0),
            lost: Arc::new(AtomicBool::new(false)),
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
    pub async fn open_stream(
        &self,
        head: Request<()>,
        end_of_stream: bool,
    ) -> Result<(ResponseFuture, SendStream<Bytes>), Status> {
        let mut sender = self.sender().await?;
        if let Err(e) = poll_fn(|cx| sender.poll_ready(cx)).await {
            tracing::debug!(backend = %self.path.display(), error = %e, "backend connection unusable; reconnecting");
            self.forget();
            sender = self.sender().await?;
            poll_fn(|cx| sender.poll_ready(cx)).await.map_err(|e| self.unavailable("connection failed", &e))?;
        }
        sender.send_request(head, end_of_stream).map_err(|e| {
            self.forget();
            self.unavailable("call failed", &e)
        })
    }

    /// Notified with the number of connections made so far, counting the first and each first
    /// one after a connection was lost (the runtime restarted), each time that number changes.
    pub fn connections(&self) -> tokio::sync::watch::Receiver<u64> {
        self.connections.subscribe()
    }

    /// Dials a connection of the caller's own, with no HTTP/2 on it yet (a relay's: the
    /// client's own preface and frames go through it).
    ///
    /// Errors: `UNAVAILABLE` naming the socket when it cannot be dialled.
    pub async fn dial_raw(&self) -> Result<UnixStream, Status> {
        let stream = UnixStream::connect(&self.path).await.map_err(|e| self.unavailable("cannot connect", &e))?;
        self.connected();
        Ok(stream)
    }

    /// Tells the backend that a connection to it broke (its peer closed it or it failed), so
    /// the next connection made counts as a reconnection.
    pub fn connection_lost(&self) {
        self.lost.store(true, Ordering::Relaxed);
    }

    /// Counts a new connection when it is the first, or the first since one was lost, and logs
    /// that at info ("connected to backend"); other connections (one per relayed client
    /// connection) at debug.
    fn connected(&self) {
        let first = *self.connections.borrow() == 0;
        if first || self.lost.swap(false, Ordering::Relaxed) {
            tracing::info!(backend = %self.path.display(), "connected to backend");
            self.connections.send_modify(|n| *n += 1);
        } else {
            tracing::debug!(path = %self.path.display(), "new backend connection");
        }
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
        // Boxed: the dial's future (the HTTP/2 handshake's codec) is larger than all the rest of
        // a call's, and every call's future would otherwise carry room for it, to be copied.
        Box::pin(self.dial()).await
    }

    /// Dials (once for a burst of callers) and starts the connection's task.
    async fn dial(&self) -> Result<SendRequest<Bytes>, Status> {
        let _guard = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let stream = UnixStream::connect(&self.path).await.map_err(|e| self.unavailable("cannot connect", &e))?;
        let stream = Socket::new(stream).map_err(|e| self.unavailable("cannot connect", &e))?;
        let (sender, conn) = h2::client::Builder::new()
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake(stream)
            .await
            .map_err(|e| self.unavailable("HTTP/2 handshake failed", &e))?;
        let (path, lost) = (self.path.clone(), self.lost.clone());
        let mut dropped = self.dropped.subscribe();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let ended = tokio::select! {
                ended = &mut conn => Some(ended),
                // Every handle is gone, so is every call: let it close, but not for ever.
                _ = dropped.changed() => tokio::time::timeout(CLOSE_GRACE, &mut conn).await.ok(),
            };
            match ended {
                Some(Ok(())) => tracing::info!(backend = %path.display(), "backend connection closed"),
                Some(Err(e)) => tracing::warn!(backend = %path.display(), error = %e, "backend connection broken"),
                None => {
                    tracing::debug!(path = %path.display(), "backend connection not closed within {CLOSE_GRACE:?} of its last use; cut")
                }
            }
            lost.store(true, Ordering::Relaxed);
        });
        self.connected();
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

    fn unavailable(&self, what: &str, err: &dyn fmt::Display) -> Status {
        Status::new(Code::UNAVAILABLE, format!("{self}: {what}: {err}"))
    }
}

/// "backend unix://PATH", as messages name the socket.
impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend unix://{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket() -> (tempfile::TempDir, PathBuf, tokio::net::UnixListener) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        (dir, path, listener)
    }

    fn head() -> Request<()> {
        Request::post("http://localhost/x.Y/Z").body(()).unwrap()
    }

    /// A peer that accepts and never reads: once the socket buffer is full the connection can
    /// never close by itself (its GOAWAY cannot be written). Dropping the `Backend` ends it
    /// within [`CLOSE_GRACE`]: the peer's socket then reports the other end closed.
    #[tokio::test]
    async fn dropping_the_backend_closes_a_connection_the_peer_never_reads() {
        let (_dir, path, listener) = socket();
        let backend = Backend::new(&path);
        let mut streams = Vec::new();
        // Header blocks are not flow-controlled: 16 × 64 KiB fill any unix socket buffer.
        for _ in 0..16 {
            let mut h = head();
            h.headers_mut().insert("x-fill", http::HeaderValue::from_str(&"x".repeat(64 << 10)).unwrap());
            streams.push(backend.open_stream(h, true).await.expect("stream"));
        }
        let (peer, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(streams);
        drop(backend);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!hung_up(&peer), "the connection waits out its grace (its GOAWAY cannot be written)");
        tokio::time::sleep(CLOSE_GRACE).await;
        assert!(hung_up(&peer), "closed once the grace ran out");
    }

    /// Whether the other end of `s` is closed (`POLLHUP`), without reading or writing.
    fn hung_up(s: &tokio::net::UnixStream) -> bool {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no wait.
        assert!(unsafe { libc::poll(&mut p, 1, 0) } >= 0);
        p.revents & libc::POLLHUP != 0
    }

    /// A peer that reads: the connection closes cleanly as soon as the last handle is dropped.
    #[tokio::test]
    async fn dropping_the_backend_closes_an_idle_connection_at_once() {
        use tokio::io::AsyncReadExt;
        let (_dir, path, listener) = socket();
        let backend = Backend::new(&path);
        backend.connect().await.unwrap();
        let (mut peer, _) = listener.accept().await.unwrap();
        drop(backend);
        let mut seen = Vec::new();
        let read = tokio::time::timeout(CLOSE_GRACE / 2, peer.read_to_end(&mut seen)).await;
        assert!(matches!(read, Ok(Ok(_))), "end of stream before the grace ran out: {read:?}");
        assert!(seen.starts_with(b"PRI * HTTP/2.0"), "the preface, then GOAWAY and the end");
    }
}
