//! The admin endpoints' HTTP/1.1 serving, the same for every listener of both daemons
//! (runtime-proxy's `--metrics-addr`, `--debug-addr` and `--admin-socket`; runtime-hooks'
//! `--metrics-addr` and `--admin-socket`): binding, and a serve loop whose cost to the daemon is
//! bounded whatever its clients do.
//!
//! # Bounds (per listener)
//!
//! | bound | value | beyond it |
//! |---|---|---|
//! | connections open at once | [`MAX_CONNECTIONS`] (64) | a new connection is accepted and closed at once (a WARN at most once a minute, with the count) |
//! | time to send a request head | [`HEADER_READ_TIMEOUT`] (5 s), from the connection's start or the previous answer | the connection is closed |
//! | request head size | [`MAX_HEAD_BYTES`] (16 KiB) | `431 Request Header Fields Too Large`, the connection closed |
//! | a connection's whole life, keep-alive included | [`CONNECTION_TIMEOUT`] (30 s) | the connection is closed (a scraper reconnects) |
//!
//! So a local user opening thousands of idle connections, or sending endless heads, holds at
//! most 64 descriptors and about 64 × 16 KiB of buffers per listener, and each for at most
//! 30 s: the CRI and hook paths keep their descriptors and memory. A refused accept (`EMFILE`)
//! is retried after 100 ms, never ends the loop.
//!
//! # The admin socket
//!
//! `--admin-socket` serves the same routes on a unix socket of mode 0600 in a directory only
//! its owner can write (the daemon's own socket directory, e.g. `/run/koord-runtimeproxy`):
//! only root (the daemon's user) can connect to it, and no other user can bind it first, so
//! `status` reads it knowing who answers ([`crate::status`]). The TCP port, by contrast, is
//! anyone's to bind when the daemon is not holding it.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

/// Connections one listener serves at once; more are closed as soon as they are accepted.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a client has to send a complete request head (from the connection's start, or from
/// the previous answer on a kept-alive connection).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one connection, however many requests it carries.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head read (request line and headers), in bytes; hyper's read buffer limit.
pub const MAX_HEAD_BYTES: usize = 16 << 10;

/// A request as a handler gets it.
pub type AdminRequest = Request<Incoming>;

/// An answer: a status, a content type and a body held in memory.
pub type Reply = Response<Full<Bytes>>;

/// The answer `status` (200, 404, 503) with `content_type` and `body`.
pub fn reply(status: u16, content_type: &str, body: impl Into<Bytes>) -> Reply {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .unwrap_or_default()
}

/// A bound admin listener: TCP (`--metrics-addr`, `--debug-addr`) or the admin socket.
pub enum Listener {
    /// A TCP listener.
    Tcp(TcpListener),
    /// The admin socket; its file is removed when this is dropped.
    Unix(AdminSocket),
}

impl Listener {
    /// Where it listens, for logs: `IP:PORT` or the socket's path.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            Listener::Unix(s) => s.path.display().to_string(),
        }
    }
}

/// The admin socket, bound by [`bind_socket`]: removed (when it is still the file this bound)
/// when dropped, so that a daemon stopped gracefully leaves no stale socket.
pub struct AdminSocket {
    listener: UnixListener,
    path: PathBuf,
    inode: Option<(u64, u64)>,
}

impl Drop for AdminSocket {
    fn drop(&mut self) {
        let same = std::fs::symlink_metadata(&self.path).ok().map(|m| (m.dev(), m.ino()));
        if same.is_some() && same == self.inode {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds `addr` for the TCP listener of `flag` (`--metrics-addr`, `--debug-addr`). Must be
/// called within a tokio runtime.
///
/// Errors, naming the flag and the address: it cannot be bound (in use by another process —
/// another instance of the daemon, or any local user who bound the port first —, not an
/// address of this host, a privileged port).
pub fn bind_tcp(flag: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let bound = std::net::TcpListener::bind(addr).and_then(|l| {
        l.set_nonblocking(true)?;
        TcpListener::from_std(l)
    });
    bound.map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::AddrInUse {
            ": another process holds the port (another instance, or any local user who bound it first); stop it, choose another address, or `off`"
        } else {
            ""
        };
        anyhow::anyhow!("{flag} {addr}: cannot listen: {e}{hint}")
    })
}

/// Binds the admin socket of `flag` (`--admin-socket`) at `path` as [`crate::socket::bind_unix`]
/// does (its directory made 0755 when missing, a stale socket replaced, a live one or a
/// non-socket never touched), then makes it mode 0600. Warns when the directory is writable by
/// group or others (then another user could put a socket of theirs there while the daemon is
/// down). Must be called within a tokio runtime.
///
/// Errors, naming the flag and the path: as `bind_unix`, or the mode cannot be set.
pub fn bind_socket(flag: &str, path: &Path) -> anyhow::Result<AdminSocket> {
    let listener = crate::socket::bind_unix(path).with_context(|| format!("{flag} {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("{flag} {}: making it mode 0600", path.display()))?;
    let meta = std::fs::symlink_metadata(path).ok();
    let socket = AdminSocket { listener, path: path.to_owned(), inode: meta.map(|m| (m.dev(), m.ino())) };
    if let Some(dir) = path.parent().and_then(|d| std::fs::metadata(d).ok()) {
        if dir.mode() & 0o022 != 0 {
            tracing::warn!(
                socket = %path.display(),
                mode = format!("{:o}", dir.mode() & 0o7777),
                "the admin socket's directory is writable by other users: while the daemon is down one of them could serve a socket there that status would ask (choose a root-only directory)"
            );
        }
    }
    Ok(socket)
}

/// Serves HTTP/1.1 on `listener` with the bounds of the module table until the task is
/// dropped, answering each request with `handler`. `what` names the endpoint in log lines
/// (`admin endpoint`, `debug endpoint`, `admin socket`).
pub async fn serve<H, Fut>(listener: Listener, what: &'static str, handler: H)
where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (mut closed, mut failed) = (0u64, 0u64);
    let (mut warned_full, mut warned_failed): (Option<Instant>, Option<Instant>) = (None, None);
    let due = |last: Option<Instant>| last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
    loop {
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Conn::Tcp(s)),
            Listener::Unix(s) => s.listener.accept().await.map(|(s, _)| Conn::Unix(s)),
        };
        let conn = match accepted {
            Ok(c) => c,
            Err(e) => {
                failed += 1;
                if due(warned_failed) {
                    tracing::warn!(endpoint = what, error = %e, failed, "accept failed; retrying in 100 ms");
                    warned_failed = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(conn);
            closed += 1;
            if due(warned_full) {
                tracing::warn!(
                    endpoint = what,
                    max = MAX_CONNECTIONS,
                    closed,
                    "connections at their limit: closing new ones at once (too many clients, or a client holding connections open)"
                );
                warned_full = Some(Instant::now());
            }
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            match conn {
                Conn::Tcp(s) => serve_connection(s, handler).await,
                Conn::Unix(s) => serve_connection(s, handler).await,
            }
            drop(permit);
        });
    }
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// One connection, within [`CONNECTION_TIMEOUT`], its heads bounded in time and size.
async fn serve_connection<S, H, Fut>(stream: S, handler: H)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let answer = handler(req);
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn ok_server() -> SocketAddr {
        let listener = bind_tcp("--metrics-addr", "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(Listener::Tcp(listener), "test endpoint", |_req| async {
            reply(200, "text/plain", "ok\n")
        }));
        addr
    }

    async fn get(addr: SocketAddr) -> String {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_string(&mut out)).await;
        out
    }

    /// 64 idle connections fill the listener; the 65th is closed at once (EOF, no answer);
    /// once they go, a request is answered again.
    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_at_once() {
        let addr = ok_server().await;
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET /heal").await.unwrap();
            idle.push(c);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf))
            .await
            .expect("closed at once, not left waiting");
        assert!(matches!(n, Ok(0) | Err(_)), "closed without an answer: {n:?}");
        drop(idle);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(get(addr).await.starts_with("HTTP/1.1 200"), "served again once the idle connections are gone");
    }

    /// A head that never ends is cut at its size bound; one that never completes at its time
    /// bound.
    #[tokio::test]
    async fn heads_are_bounded_in_size_and_time() {
        let addr = ok_server().await;
        let mut big = tokio::net::TcpStream::connect(addr).await.unwrap();
        big.write_all(b"GET / HTTP/1.1\r\nX-Big: ").await.unwrap();
        let filler = vec![b'a'; 4096];
        let mut sent = 0;
        while sent < 1 << 20 {
            if big.write_all(&filler).await.is_err() {
                break;
            }
            sent += filler.len();
        }
        assert!(sent < 1 << 20, "a 1 MiB head was read whole");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), big.read_to_end(&mut answer)).await;
        assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 431"), "{}", String::from_utf8_lossy(&answer));

        let started = Instant::now();
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(HEADER_READ_TIMEOUT * 3, slow.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "an unfinished head is not closed within {:?}", HEADER_READ_TIMEOUT * 3);
        assert!(
            started.elapsed() >= HEADER_READ_TIMEOUT - Duration::from_millis(500),
            "closed after {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn the_admin_socket_is_0600_and_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/admin.sock");
        let socket = bind_socket("--admin-socket", &path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let err = bind_socket("--admin-socket", &path).err().unwrap().to_string();
        assert!(err.starts_with(&format!("--admin-socket {}", path.display())), "{err}");
        drop(socket);
        assert!(!path.exists(), "removed");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind_tcp("--metrics-addr", addr).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("--metrics-addr {addr}: cannot listen: "))
                && err.contains("another process holds the port"),
            "{err}"
        );
    }
}
