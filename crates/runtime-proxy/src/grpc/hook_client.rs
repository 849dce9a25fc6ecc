//! The client for hook servers: one unary gRPC call at a time per connection, made by the
//! calling task itself.
//!
//! # Why not h2's client
//!
//! With h2's client every hook call went through the connection's task and its stream state
//! machine (queues, a stream slab, `http` types for every header): about 45,000 of the ~213,000
//! instructions the proxy spent per hooked CreateContainer (callgrind, docs/benchmarks.md). A
//! hook call is one exchange — a request written whole, an answer read whole — so here the
//! task that makes it writes the request and reads the answer on a connection it holds alone
//! for that time, with the frame and HPACK code of the relay ([`crate::http2::frame`],
//! [`crate::http2::hpack`]).
//!
//! # Connections
//!
//! A call takes an idle connection to the server (or dials one), opens the next stream on it,
//! and puts it back once the answer is complete; concurrent calls therefore use as many
//! connections, of which at most [`MAX_IDLE`] stay open when idle. With one stream open per
//! connection the server's `SETTINGS_MAX_CONCURRENT_STREAMS` is never reached: no call waits in
//! a queue of streams, or is reset there when it gives up (a burst of such resets makes hyper
//! and tonic servers close the connection for "rapid resets", failing the calls on it). A call
//! that gives up (its timeout, the CRI call's deadline: its future is dropped) drops its
//! connection: the server sees it closed and cancels the call, and no other call shared it.
//!
//! While a connection is idle, one task per client (`watch`) reads what the server sends on
//! it: PINGs and SETTINGS are acknowledged, and a connection the server ends or is going away on
//! (GOAWAY) is closed — a server shutting down gracefully (h2, hyper, grpc-go) waits for its PING
//! to be acknowledged and for its connections to close, and would otherwise wait for ever. The
//! connection's HTTP/2 is in `hook_conn.rs`.
//!
//! Each new connection is checked with `SO_PEERCRED`: the process serving the socket must run
//! as one of the allowed uids (the registration's `allowed-uids`).
//!
//! # What a server can make it hold
//!
//! The proxy runs on one thread, so a hook server must not be able to grow the client's memory
//! or keep its task busy through its answers and its connection alone (a server that answered,
//! then sent PINGs on the idle connection and never read: the proxy grew to gigabytes and CRI
//! calls stalled for seconds). The bounds, each dropping the connection beyond it (an idle one
//! with a WARN naming the server and why; a call's failing the call `UNAVAILABLE`):
//!
//! * At most [`MAX_PENDING_ACKS`] PING and SETTINGS acknowledgements unwritten: a server that
//!   sends them faster than it reads gets no more.
//! * An idle connection whose write stays blocked for [`WRITE_STALL`] (its server does not read)
//!   is dropped by the watcher; one taken for a call that has more than a wake-up's frames
//!   waiting, or acknowledgements the socket does not take at once, is dropped rather than used
//!   (the call dials a new one).
//! * At most [`MAX_IDLE_FRAMES`] frames within 10 s on an idle connection (keepalive PINGs come
//!   at most once a second), and no unfinished header block over 64 KiB there: a flood of any
//!   frame kind (PING, SETTINGS with thousands of parameters, WINDOW_UPDATE, PRIORITY, RST_STREAM,
//!   HEADERS or DATA of streams not open, endless CONTINUATIONs, unknown types) ends there.
//! * A call takes its answer's frames, the request's WINDOW_UPDATEs and at most
//!   [`CALL_CONTROL_FRAMES`] other frames plus one per KiB of request; acknowledgements are written
//!   as the socket takes them, so a call never waits on writing them.
//! * The reader yields to the runtime every 64 frames or 64 KiB, in the watcher and in a call;
//!   it reads 16 KiB at a time and only once what it holds is taken as frames, so its buffer
//!   holds one unfinished frame (or, in a call, header block) and one read.
//!
//! # The HTTP/2 it speaks (RFC 9113)
//!
//! * The client preface, SETTINGS (no server push; a stream window of
//!   [`STREAM_WINDOW`](crate::grpc::backend::STREAM_WINDOW) bytes; header lists up to
//!   [`MAX_HEADER_LIST_SIZE`](crate::grpc::backend::MAX_HEADER_LIST_SIZE) bytes) and a connection
//!   window of [`CONNECTION_WINDOW`](crate::grpc::backend::CONNECTION_WINDOW) bytes go out with
//!   the first request, without waiting for the server's SETTINGS (§3.4).
//! * The request's header block is literal fields without indexing, never Huffman-coded (RFC
//!   7541 §6.2.2), so it needs no encoder state; the answer's blocks are decoded with the
//!   connection's HPACK table (headers of any stream, to keep the table in step).
//! * Flow control both ways: the request's DATA within the server's connection and stream
//!   windows (waiting for its WINDOW_UPDATEs), the answer's DATA given back with WINDOW_UPDATEs
//!   once half a window is used. A WINDOW_UPDATE past 2^31 - 1 ends the connection.
//! * SETTINGS and PING are acknowledged, also those that arrive while the connection is idle.
//!   GOAWAY: the connection is not used again; a stream the
//!   GOAWAY says was not processed (above its last stream ID), or one refused with
//!   `REFUSED_STREAM`, or a request that could not be written to a connection taken idle, is
//!   sent once more on a new connection — none of them reached the server's application.
//! * Frames larger than 16,384 bytes (the default `SETTINGS_MAX_FRAME_SIZE`, which the client
//!   does not raise), PUSH_PROMISE, a CONTINUATION out of place or a header block that does not
//!   decode end the connection and fail the call.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::net::UnixStream;

use crate::grpc::unary_call::Answer;
use crate::grpc::{self, Code, Status, USER_AGENT};
use crate::http2::frame;
use daemon_support::uds::Socket;

use conn::Conn;

#[path = "hook_conn.rs"]
mod conn;

/// Most idle connections kept per hook server; a burst of concurrent calls opens more, closed
/// as they finish beyond this number.
pub const MAX_IDLE: usize = 16;

/// Most PING and SETTINGS acknowledgements a connection holds unwritten (17 and 9 bytes each):
/// one more and the connection is dropped — the server sends them faster than it reads.
pub const MAX_PENDING_ACKS: usize = 64;

/// Frames a connection's reader takes, and bytes it reads, before it yields to the runtime (the
/// proxy runs on one thread: a peer flooding frames must not keep every CRI call waiting).
const FRAMES_PER_WAKE: usize = 64;
const BYTES_PER_WAKE: usize = 64 << 10;

/// Longest an idle connection's write (acknowledgements, window updates) may stay blocked: then
/// the server does not read, and the connection is dropped.
pub const WRITE_STALL: Duration = Duration::from_secs(2);

/// Most frames an idle connection may receive within 10 s (`IDLE_FRAMES_WINDOW`); one more and
/// it is dropped. Ordinary traffic there is keepalive PINGs, which grpc-go sends at most once a
/// second, a SETTINGS, a GOAWAY.
pub const MAX_IDLE_FRAMES: u32 = 1000;
const IDLE_FRAMES_WINDOW: Duration = Duration::from_secs(10);

/// Most bytes of an unfinished header block (HEADERS then CONTINUATIONs) held for an idle
/// connection, where no stream is open.
const MAX_IDLE_PARTIAL: usize = 64 << 10;

/// Frames other than its answer's (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, unknown types,
/// frames of streams ended before, empty DATA, informational headers) that one call takes:
/// this many plus one per KiB of request; one more fails the call.
pub const CALL_CONTROL_FRAMES: usize = 1024;

/// The client for one hook server's unix socket: its idle connections and who may serve it.
pub struct HookClient {
    path: PathBuf,
    /// Uids allowed to serve the socket (`SO_PEERCRED`), checked on every new connection.
    allowed_uids: Vec<u32>,
    /// Connections between calls, tended meanwhile by the watcher task.
    idle: Arc<Idle>,
    /// The watcher task (see [`watch`]), stopped with the client.
    watcher: tokio::task::AbortHandle,
}

impl Drop for HookClient {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// The idle connections of a client (the last put back is taken first), and a wake-up for the
/// watcher when one is put back.
struct Idle {
    conns: Mutex<Vec<Conn>>,
    put_back: tokio::sync::Notify,
    /// The socket path, for the log.
    server: String,
}

impl HookClient {
    /// A client for the hook server listening on the unix socket `path`, which must be run by
    /// one of `allowed_uids`; nothing is dialled until the first call. Starts the task that
    /// tends its idle connections, so it must be called within a tokio runtime.
    pub fn new(path: impl Into<PathBuf>, allowed_uids: Vec<u32>) -> Self {
        let path = path.into();
        let server = path.display().to_string();
        let idle = Arc::new(Idle { conns: Mutex::default(), put_back: tokio::sync::Notify::new(), server });
        let watcher = tokio::spawn(watch(idle.clone())).abort_handle();
        HookClient { path, allowed_uids, idle, watcher }
    }

    /// The hook server's socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One unary call of `rpc_path` (`/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook`)
    /// with `body` (one gRPC length-prefixed message) and `grpc-timeout: timeout`; returns the
    /// answer, whose body may hold at most `max_message` bytes plus the 5-byte prefix. No
    /// deadline of its own: the caller bounds it (dropping the future closes the connection).
    ///
    /// Errors: `UNAVAILABLE` "hook server unix://PATH: cannot connect: …" when it cannot be
    /// dialled, "`rpc`: hook server unix://PATH failed the call: …" when the connection breaks,
    /// the stream is reset, or the server breaks the protocol; `PERMISSION_DENIED` when the
    /// process serving the socket runs as a uid not allowed (see [`HookClient::new`]);
    /// `RESOURCE_EXHAUSTED` "`rpc`: answer from … larger than one message of `max_message`
    /// bytes" as soon as the answer's body passes that.
    pub async fn call(
        &self,
        rpc_path: &str,
        timeout: Duration,
        body: Bytes,
        rpc: &str,
        max_message: usize,
    ) -> Result<Answer, Status> {
        let block = request_block(rpc_path, timeout);
        let mut retried = false;
        loop {
            let (mut conn, reused) = if retried { (self.dial().await?, false) } else { self.take().await? };
            match conn.exchange(&block, &body, max_message.saturating_add(5), reused).await {
                Ok(answer) => {
                    self.put_back(conn);
                    return Ok(answer);
                }
                Err(Failure::Unprocessed(why)) if !retried => {
                    tracing::debug!(hook_server = %self.path.display(), reason = %why, "hook call not processed; sending it again on a new connection");
                    retried = true;
                }
                Err(Failure::TooLarge) => {
                    return Err(Status::new(
                        Code::RESOURCE_EXHAUSTED,
                        format!("{rpc}: answer from {self} larger than one message of {max_message} bytes"),
                    ))
                }
                Err(Failure::Unprocessed(why) | Failure::Broken(why)) => {
                    return Err(Status::new(Code::UNAVAILABLE, format!("{rpc}: {self} failed the call: {why}")))
                }
            }
        }
    }

    /// An idle connection still usable (what arrived on it meanwhile read, its acknowledgements
    /// written), or a new one; and whether it was idle. An idle connection that would make the
    /// call wait — more frames waiting than one wake-up takes, or acknowledgements the server
    /// does not read — is dropped instead.
    async fn take(&self) -> Result<(Conn, bool), Status> {
        loop {
            let conn = self.idle.conns.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match conn {
                Some(mut c) => match c.revive() {
                    Ok(()) => return Ok((c, true)),
                    Err(unfit) => unfit.log(&self.idle.server),
                },
                None => return Ok((self.dial().await?, false)),
            }
        }
    }

    fn put_back(&self, conn: Conn) {
        if conn.usable() {
            let mut idle = self.idle.conns.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push(conn);
                drop(idle);
                self.idle.put_back.notify_one();
            }
        }
    }

    async fn dial(&self) -> Result<Conn, Status> {
        let stream = UnixStream::connect(&self.path).await.map_err(|e| self.unavailable("cannot connect", &e))?;
        self.check_peer(&stream)?;
        let io = Socket::new(stream).map_err(|e| self.unavailable("cannot connect", &e))?;
        tracing::debug!(hook_server = %self.path.display(), "new hook server connection");
        Ok(Conn::new(io))
    }

    /// Checks the process serving a new connection against the allowed uids.
    ///
    /// Errors: `PERMISSION_DENIED` naming the socket, the peer's uid and pid and the allowed
    /// uids (the server is there, but may not serve); `UNAVAILABLE` when the peer's credentials
    /// could not be read.
    fn check_peer(&self, stream: &UnixStream) -> Result<(), Status> {
        let cred =
            stream.peer_cred().map_err(|e| self.unavailable("cannot read the peer's credentials (SO_PEERCRED)", &e))?;
        if self.allowed_uids.contains(&cred.uid()) {
            return Ok(());
        }
        let why = format!(
            "{self} is run by uid {} (pid {}), not by an allowed uid {:?}",
            cred.uid(),
            cred.pid().map_or_else(|| "?".to_owned(), |p| p.to_string()),
            self.allowed_uids
        );
        Err(Status::new(Code::PERMISSION_DENIED, why))
    }

    fn unavailable(&self, what: &str, err: &dyn fmt::Display) -> Status {
        Status::new(Code::UNAVAILABLE, format!("{self}: {what}: {err}"))
    }
}

/// "hook server unix://PATH", as messages name the socket.
impl fmt::Display for HookClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hook server unix://{}", self.path.display())
    }
}

/// The header block of a hook call: what grpc-go and tonic send for a unary call, with
/// `grpc-timeout` so the server can give up when the proxy does. The authority is never
/// dialled; "localhost" is what grpc-go sends for unix sockets.
fn request_block(rpc_path: &str, timeout: Duration) -> BytesMut {
    let mut block = BytesMut::with_capacity(160 + rpc_path.len());
    // `:method: POST` and `:scheme: http` are entries 3 and 6 of the static table (RFC 7541
    // Appendix A): indexed, they leave the dynamic table alone.
    block.extend_from_slice(&[0x83, 0x86]);
    frame::put_literal(&mut block, b":path", rpc_path.as_bytes());
    frame::put_literal(&mut block, b":authority", b"localhost");
    frame::put_literal(&mut block, b"content-type", b"application/grpc");
    frame::put_literal(&mut block, b"te", b"trailers");
    frame::put_literal(&mut block, b"grpc-timeout", grpc::timeout_value(timeout).as_bytes());
    frame::put_literal(&mut block, b"user-agent", USER_AGENT.as_bytes());
    block
}

/// Tends the idle connections of a client for as long as it lives: what a server sends on a
/// connection nobody is using — a PING (grpc-go's keepalive, h2's graceful shutdown, which waits
/// for its acknowledgement before it closes), SETTINGS, a GOAWAY, the end — is read when it
/// arrives and answered; a connection the server is closing is closed, so that a server shutting
/// down gracefully is not kept waiting by the proxy's idle connections. A connection that passes
/// a bound (see [`Conn::tend`]) is dropped with a WARN naming the server and why; at most
/// [`FRAMES_PER_WAKE`] frames of each are taken per wake-up.
async fn watch(idle: Arc<Idle>) {
    // Wakes the watcher when the first blocked write of an idle connection reaches WRITE_STALL.
    let mut stall = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
    loop {
        let put_back = idle.put_back.notified();
        tokio::pin!(put_back);
        put_back.as_mut().enable();
        std::future::poll_fn(|cx| {
            if put_back.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            // Twice at most: the stall timer, when it has fired, lets the connections it was
            // set for be dropped at once.
            for _ in 0..2 {
                let mut earliest: Option<tokio::time::Instant> = None;
                // Each connection's read (and write) readiness now wakes this task.
                idle.conns.lock().unwrap_or_else(|p| p.into_inner()).retain_mut(|c| match c.tend(cx) {
                    Ok(()) => {
                        earliest = match (earliest, c.stall_deadline()) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        true
                    }
                    Err(unfit) => {
                        unfit.log(&idle.server);
                        false
                    }
                });
                let Some(deadline) = earliest else { break };
                if stall.deadline() != deadline {
                    stall.as_mut().reset(deadline);
                }
                if stall.as_mut().poll(cx).is_pending() {
                    break;
                }
            }
            Poll::Pending
        })
        .await;
    }
}

/// Why an idle connection is not kept.
#[derive(Debug)]
struct Unfit {
    why: String,
    /// The server passed one of the client's bounds (logged at WARN), rather than ending the
    /// connection or breaking the protocol (DEBUG).
    bound: bool,
}

impl Unfit {
    fn ended(why: impl Into<String>) -> Unfit {
        Unfit { why: why.into(), bound: false }
    }

    fn bound(why: impl Into<String>) -> Unfit {
        Unfit { why: why.into(), bound: true }
    }

    fn log(&self, server: &str) {
        if self.bound {
            tracing::warn!(hook_server = %server, reason = %self.why, "idle hook server connection dropped");
        } else {
            tracing::debug!(hook_server = %server, reason = %self.why, "idle hook server connection closed");
        }
    }
}

/// Why an exchange failed.
#[derive(Debug)]
enum Failure {
    /// The request did not reach the server's application (see the module docs): it may be
    /// sent again on a new connection.
    Unprocessed(String),
    /// The answer's body passed its limit.
    TooLarge,
    /// The connection broke or the server broke the protocol, or reset the stream.
    Broken(String),
}

#[cfg(test)]
#[path = "hook_client_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "hook_client_flood_tests.rs"]
mod flood_tests;
