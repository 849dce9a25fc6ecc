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
//! # Hook servers
//!
//! The dispatcher uses the same client for hook servers ([`Backend::hook_server`]): each new
//! connection is then checked with `SO_PEERCRED` against the uids allowed to serve the socket,
//! and its connection lines are logged at debug (a hook call's failure is logged by the
//! dispatcher).
//!
//! # Lifetime
//!
//! A connection's task ends when the connection does, or at the latest [`CLOSE_GRACE`] after the
//! last handle of its `Backend` is dropped. Every caller holds a handle (or a borrow) for as long
//! as its streams live, so by then no call is left on the connection; the grace lets HTTP/2 send
//! its GOAWAY and close cleanly, and the cut-off ends a connection whose peer stopped reading (a
//! frozen hook server), which would otherwise keep its task, socket and queued frames for ever.

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

use crate::cri::uds::Socket;
use crate::grpc::{Code, Status};

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
    /// What serves the socket, for messages and logs: "backend" or "hook server".
    what: &'static str,
    /// Uids allowed to serve the socket (`SO_PEERCRED`), checked on every new connection;
    /// `None`: not checked.
    allowed_uids: Option<Vec<u32>>,
    /// Never sent to: dropped with the `Backend`, which tells its connection tasks to close.
    dropped: tokio::sync::watch::Sender<()>,
    /// Hook servers: streams are opened one at a time, each once the one before is no longer
    /// pending open (held back by the server's `max_concurrent_streams`), through the sender
    /// kept here — as hyper's client does. A call that gives up while it waits (a hook timeout)
    /// then never opens its stream. Without it every waiting call's stream is queued in h2 and
    /// opened when a slot frees, even after its caller gave up, and reset at once: a burst of
    /// such resets makes an h2 server (hyper, tonic) close the connection for rapid resets
    /// (`max_pending_accept_reset_streams`), failing every other call on it.
    one_pending: Option<tokio::sync::Mutex<Option<SendRequest<Bytes>>>>,
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
            what: "backend",
            allowed_uids: None,
            dropped: tokio::sync::watch::Sender::new(()),
            one_pending: None,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            connections: tokio::sync::watch::Sender::new(0),
            lost: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A client for the hook server listening on the unix socket `path`; nothing is dialled until
    /// the first call. Every new connection is checked with `SO_PEERCRED`: the process serving
    /// the socket must run as one of `allowed_uids`, else the connection is closed and the call
    /// fails `UNAVAILABLE` with "hook server unix://PATH is run by uid N (pid P), not by an
    /// allowed uid [..]" (the next call dials again). Its messages name a "hook server" rather
    /// than a "backend", it logs its connections at debug, and it opens one stream at a time:
    /// while the server's `max_concurrent_streams` holds back the stream opened last, the next
    /// call waits in the proxy (cancellably), as with hyper's client, so a hook call that times
    /// out there never reaches the server.
    pub fn hook_server(path: impl Into<PathBuf>, allowed_uids: Vec<u32>) -> Self {
        Backend {
            what: "hook server",
            allowed_uids: Some(allowed_uids),
            one_pending: Some(tokio::sync::Mutex::new(None)),
            ..Backend::new(path)
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
    /// Errors: `UNAVAILABLE` naming the socket when it cannot be dialled or the connection fails,
    /// or (a [`Backend::hook_server`]) when the process serving it runs as a uid not allowed.
    pub async fn open_stream(&self, head: Request<()>, end_of_stream: bool) -> Result<(ResponseFuture, SendStream<Bytes>), Status> {
        let Some(gate) = &self.one_pending else { return self.open_on(None, head, end_of_stream).await };
        let mut last = gate.lock().await;
        let opened = self.open_on(Some(&mut last), head, end_of_stream).await;
        if opened.is_err() {
            // Whatever failed, the next call starts from the live connection.
            *last = None;
        }
        opened
    }

    /// Opens a stream on the live connection. With `last` (a hook server): through the sender
    /// kept there, once the stream it opened last is no longer pending open. The sender stays
    /// there while it waits, so a caller that gives up meanwhile leaves it for the next one.
    async fn open_on(
        &self,
        last: Option<&mut Option<SendRequest<Bytes>>>,
        head: Request<()>,
        end_of_stream: bool,
    ) -> Result<(ResponseFuture, SendStream<Bytes>), Status> {
        let mut fresh;
        let sender = match last {
            Some(slot) => match slot {
                Some(s) => s,
                None => slot.insert(self.sender().await?),
            },
            None => {
                fresh = self.sender().await?;
                &mut fresh
            }
        };
        if let Err(e) = poll_fn(|cx| sender.poll_ready(cx)).await {
            tracing::debug!(backend = %self.path.display(), error = %e, "{} connection unusable; reconnecting", self.what);
            self.forget();
            *sender = self.sender().await?;
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
            if self.allowed_uids.is_some() {
                tracing::debug!(hook_server = %self.path.display(), "connected to hook server");
            } else {
                tracing::info!(backend = %self.path.display(), "connected to backend");
            }
            self.connections.send_modify(|n| *n += 1);
        } else {
            tracing::debug!(path = %self.path.display(), "new {} connection", self.what);
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
        self.check_peer(&stream)?;
        let stream = Socket::new(stream).map_err(|e| self.unavailable("cannot connect", &e))?;
        let (sender, conn) = h2::client::Builder::new()
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake(stream)
            .await
            .map_err(|e| self.unavailable("HTTP/2 handshake failed", &e))?;
        let (path, what, hook, lost) = (self.path.clone(), self.what, self.allowed_uids.is_some(), self.lost.clone());
        let mut dropped = self.dropped.subscribe();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let ended = tokio::select! {
                ended = &mut conn => Some(ended),
                // Every handle is gone, so is every call: let it close, but not for ever.
                _ = dropped.changed() => tokio::time::timeout(CLOSE_GRACE, &mut conn).await.ok(),
            };
            match ended {
                Some(Ok(())) if hook => tracing::debug!(hook_server = %path.display(), "{what} connection closed"),
                Some(Ok(())) => tracing::info!(backend = %path.display(), "{what} connection closed"),
                Some(Err(e)) if hook => tracing::debug!(hook_server = %path.display(), error = %e, "{what} connection broken"),
                Some(Err(e)) => tracing::warn!(backend = %path.display(), error = %e, "{what} connection broken"),
                None => tracing::debug!(path = %path.display(), "{what} connection not closed within {CLOSE_GRACE:?} of its last use; cut"),
            }
            lost.store(true, Ordering::Relaxed);
        });
        self.connected();
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender.clone());
        Ok(sender)
    }

    /// Checks the process serving a new connection against `allowed_uids`, if set.
    ///
    /// Errors: `PERMISSION_DENIED` naming the socket, the peer's uid and pid and the allowed
    /// uids (the server is there, but may not serve); `UNAVAILABLE` when the peer's credentials
    /// could not be read.
    fn check_peer(&self, stream: &UnixStream) -> Result<(), Status> {
        let Some(allowed) = &self.allowed_uids else { return Ok(()) };
        let cred = stream.peer_cred().map_err(|e| self.unavailable("cannot read the peer's credentials (SO_PEERCRED)", &e))?;
        if allowed.contains(&cred.uid()) {
            return Ok(());
        }
        let why = format!(
            "{} unix://{} is run by uid {} (pid {}), not by an allowed uid {:?}",
            self.what,
            self.path.display(),
            cred.uid(),
            cred.pid().map_or_else(|| "?".to_owned(), |p| p.to_string()),
            allowed
        );
        Err(Status::new(Code::PERMISSION_DENIED, why))
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

/// "backend unix://PATH" or "hook server unix://PATH", as messages name the socket.
impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} unix://{}", self.what, self.path.display())
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

    #[tokio::test]
    async fn a_peer_run_by_a_uid_not_allowed_is_refused_naming_uid_and_pid() {
        let (_dir, path, listener) = socket();
        let _accept = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let own = unsafe { libc::geteuid() };
        let other = own.wrapping_add(1);
        let refused = Backend::hook_server(&path, vec![other]).open_stream(head(), true).await.expect_err("refused");
        assert_eq!(refused.code, Code::PERMISSION_DENIED, "the server is there but may not serve");
        let want = format!(
            "hook server unix://{} is run by uid {own} (pid {}), not by an allowed uid [{other}]",
            path.display(),
            std::process::id()
        );
        assert_eq!(refused.message, want);
        let _allowed = Backend::hook_server(&path, vec![other, own]).open_stream(head(), true).await.expect("allowed");
    }

    #[tokio::test]
    async fn messages_name_a_hook_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.sock");
        let err = Backend::hook_server(&path, vec![0]).connect().await.unwrap_err();
        assert!(err.message.starts_with(&format!("hook server unix://{}: cannot connect: ", path.display())), "{}", err.message);
        let err = Backend::new(&path).connect().await.unwrap_err();
        assert!(err.message.starts_with(&format!("backend unix://{}: cannot connect: ", path.display())), "{}", err.message);
    }

    /// A peer that accepts and never reads: once the socket buffer is full the connection can
    /// never close by itself (its GOAWAY cannot be written). Dropping the `Backend` ends it
    /// within [`CLOSE_GRACE`]: the peer's socket then reports the other end closed.
    #[tokio::test]
    async fn dropping_the_backend_closes_a_connection_the_peer_never_reads() {
        let (_dir, path, listener) = socket();
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let backend = Backend::hook_server(&path, vec![unsafe { libc::geteuid() }]);
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

    /// A hook server whose stream limit is reached: calls that give up while they wait for a
    /// slot never open their stream (the server sees none of them, so no burst of resets that
    /// would make it close the connection), and the connection keeps serving.
    #[tokio::test]
    async fn hook_calls_beyond_the_servers_stream_limit_wait_in_the_proxy() {
        let (_dir, path, listener) = socket();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = seen.clone();
        let _server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::Builder::new().max_concurrent_streams(1).handshake::<_, Bytes>(stream).await.unwrap();
            let mut held = Vec::new();
            while let Some(Ok((req, respond))) = conn.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push((req, respond));
            }
        });
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let backend = Backend::hook_server(&path, vec![unsafe { libc::geteuid() }]);
        let first = backend.open_stream(head(), true).await.expect("first stream");
        assert!(eventually(|| seen.load(std::sync::atomic::Ordering::SeqCst) == 1).await, "the server got the first");
        for _ in 0..30 {
            let waited = tokio::time::timeout(Duration::from_millis(20), async {
                let (response, _send) = backend.open_stream(head(), true).await?;
                response.await.map_err(|e| Status::new(Code::UNAVAILABLE, e.to_string()))
            })
            .await;
            assert!(waited.is_err(), "no slot: the call waits until it gives up");
        }
        drop(first);
        let (response, _send) = backend.open_stream(head(), true).await.expect("a slot again");
        assert!(eventually(|| seen.load(std::sync::atomic::Ordering::SeqCst) >= 2).await, "the server got it");
        tokio::time::sleep(Duration::from_millis(100)).await;
        // At most the one stream that was already queued (pending open) when its caller gave up
        // reached the server, opened and reset at once; not the 30.
        let n = seen.load(std::sync::atomic::Ordering::SeqCst);
        assert!(n <= 3, "{n} streams reached the server");
        drop(response);
    }

    /// Whether `f` holds within 5 s.
    async fn eventually(f: impl Fn() -> bool) -> bool {
        for _ in 0..500 {
            if f() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
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
