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
//! for that time, with the frame and HPACK code of the relay ([`crate::cri::frame`],
//! [`crate::cri::hpack`]).
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
//! to be acknowledged and for its connections to close, and would otherwise wait for ever.
//!
//! Each new connection is checked with `SO_PEERCRED`: the process serving the socket must run
//! as one of the allowed uids (the registration's `allowed-uids`).
//!
//! # The HTTP/2 it speaks (RFC 9113)
//!
//! * The client preface, SETTINGS (no server push; a stream window of
//!   [`STREAM_WINDOW`] bytes; header lists up to
//!   [`MAX_HEADER_LIST_SIZE`] bytes) and a connection
//!   window of [`CONNECTION_WINDOW`] bytes go out with
//!   the first request, without waiting for the server's SETTINGS (§3.4).
//! * The request's header block is literal fields without indexing, never Huffman-coded (RFC
//!   7541 §6.2.2), so it needs no encoder state; the answer's blocks are decoded with the
//!   connection's HPACK table (headers of any stream, to keep the table in step).
//! * Flow control both ways: the request's DATA within the server's connection and stream
//!   windows (waiting for its WINDOW_UPDATEs), the answer's DATA given back with WINDOW_UPDATEs
//!   once half a window is used (the connection's go out with the next request).
//! * SETTINGS and PING are acknowledged, also those that arrived while the connection was idle
//!   (read when it is taken again). GOAWAY: the connection is not used again; a stream the
//!   GOAWAY says was not processed (above its last stream ID), or one refused with
//!   `REFUSED_STREAM`, or a request that could not be written to a connection taken idle, is
//!   sent once more on a new connection — none of them reached the server's application.
//! * Frames larger than 16,384 bytes (the default `SETTINGS_MAX_FRAME_SIZE`, which the client
//!   does not raise), PUSH_PROMISE, a CONTINUATION out of place or a header block that does not
//!   decode end the connection and fail the call.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixStream;

use crate::cri::frame::{self, flag, kind, reason, setting, Head, DEFAULT_MAX_FRAME, DEFAULT_WINDOW, HEAD_LEN, PREFACE};
use crate::cri::hpack;
use crate::grpc::backend::{CONNECTION_WINDOW, MAX_HEADER_LIST_SIZE, STREAM_WINDOW};
use crate::grpc::unary_call::{Answer, Body, TooLarge};
use crate::grpc::{self, Code, Status};
use daemon_support::uds::Socket;

/// Most idle connections kept per hook server; a burst of concurrent calls opens more, closed
/// as they finish beyond this number.
pub const MAX_IDLE: usize = 16;

/// Most fields in one header block of an answer.
const MAX_FIELDS: usize = 4096;

/// SETTINGS_ENABLE_PUSH (RFC 9113 §6.5.2).
const ENABLE_PUSH: u16 = 0x2;
/// SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 §6.5.2).
const MAX_HEADER_LIST: u16 = 0x6;

/// Highest stream ID a client may open (RFC 9113 §5.1.1: 31 bits, odd).
const LAST_STREAM_ID: u32 = (1 << 31) - 1;

/// The user agent hook servers see.
const USER_AGENT: &str = concat!("runtime-proxy/", env!("CARGO_PKG_VERSION"));

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
#[derive(Default)]
struct Idle {
    conns: Mutex<Vec<Conn>>,
    put_back: tokio::sync::Notify,
}

impl HookClient {
    /// A client for the hook server listening on the unix socket `path`, which must be run by
    /// one of `allowed_uids`; nothing is dialled until the first call. Starts the task that
    /// tends its idle connections, so it must be called within a tokio runtime.
    pub fn new(path: impl Into<PathBuf>, allowed_uids: Vec<u32>) -> Self {
        let idle = Arc::new(Idle::default());
        let watcher = tokio::spawn(watch(idle.clone())).abort_handle();
        HookClient { path: path.into(), allowed_uids, idle, watcher }
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
    pub async fn call(&self, rpc_path: &str, timeout: Duration, body: Bytes, rpc: &str, max_message: usize) -> Result<Answer, Status> {
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

    /// An idle connection still usable (what arrived on it meanwhile read), or a new one; and
    /// whether it was idle.
    async fn take(&self) -> Result<(Conn, bool), Status> {
        loop {
            let conn = self.idle.conns.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match conn {
                Some(mut c) => match c.catch_up() {
                    Ok(()) if c.usable() => return Ok((c, true)),
                    Ok(()) => {
                        tracing::debug!(hook_server = %self.path.display(), "idle hook server connection closed by the server (GOAWAY)")
                    }
                    Err(why) => tracing::debug!(hook_server = %self.path.display(), reason = %why, "idle hook server connection lost"),
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
        let cred = stream.peer_cred().map_err(|e| self.unavailable("cannot read the peer's credentials (SO_PEERCRED)", &e))?;
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
/// down gracefully is not kept waiting by the proxy's idle connections.
async fn watch(idle: Arc<Idle>) {
    loop {
        let put_back = idle.put_back.notified();
        tokio::pin!(put_back);
        put_back.as_mut().enable();
        std::future::poll_fn(|cx| {
            if put_back.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            // Each connection's read (and write) readiness now wakes this task.
            idle.conns.lock().unwrap_or_else(|p| p.into_inner()).retain_mut(|c| c.tend(cx));
            Poll::Pending
        })
        .await;
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

/// What a frame of the answer's stream carried.
enum Event {
    /// DATA of a stream (its payload without padding), with END_STREAM or not.
    Data { stream: u32, end: bool, data: Bytes },
    /// A header block of a stream, decoded into `Conn::fields`, with END_STREAM or not.
    Headers { stream: u32, end: bool },
    /// RST_STREAM with its error code.
    Reset { stream: u32, reason: u32 },
}

/// One connection and the HTTP/2 state the client keeps for it.
struct Conn {
    io: Socket,
    /// Bytes read and not yet taken as frames.
    read: BytesMut,
    /// Frames to write with the next write.
    out: BytesMut,
    /// `out` holds an acknowledgement the server waits for (SETTINGS, PING): written at the end
    /// of a call rather than with the next one.
    urgent: bool,
    hpack: hpack::Decoder,
    fields: hpack::Fields,
    /// The ID of the next stream to open.
    next_stream: u32,
    /// The server's connection-level send window, in bytes.
    conn_window: i64,
    /// The server's window for the open stream, in bytes.
    stream_window: i64,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE, in bytes.
    initial_window: i64,
    /// The server's SETTINGS_MAX_FRAME_SIZE, in bytes.
    max_frame: usize,
    /// Bytes of DATA received on the connection and on the open stream since the last
    /// WINDOW_UPDATE of each.
    conn_unacked: u32,
    stream_unacked: u32,
    /// The last stream ID of a GOAWAY received.
    goaway: Option<u32>,
    /// A broken connection is never used again.
    broken: bool,
}

impl Conn {
    fn new(io: Socket) -> Conn {
        let mut out = BytesMut::with_capacity(8 << 10);
        out.extend_from_slice(PREFACE);
        frame::settings(
            &mut out,
            &[(ENABLE_PUSH, 0), (setting::INITIAL_WINDOW_SIZE, STREAM_WINDOW), (MAX_HEADER_LIST, MAX_HEADER_LIST_SIZE)],
        );
        frame::window_update(&mut out, 0, CONNECTION_WINDOW - DEFAULT_WINDOW as u32);
        Conn {
            io,
            read: BytesMut::with_capacity(16 << 10),
            out,
            urgent: false,
            hpack: hpack::Decoder::default(),
            fields: hpack::Fields::default(),
            next_stream: 1,
            conn_window: DEFAULT_WINDOW,
            stream_window: DEFAULT_WINDOW,
            initial_window: DEFAULT_WINDOW,
            max_frame: DEFAULT_MAX_FRAME,
            conn_unacked: 0,
            stream_unacked: 0,
            goaway: None,
            broken: false,
        }
    }

    /// Whether another stream may be opened on it.
    fn usable(&self) -> bool {
        !self.broken && self.goaway.is_none() && self.next_stream <= LAST_STREAM_ID
    }

    /// Reads, without waiting, what arrived while the connection was idle, and takes its frames
    /// (SETTINGS, PING, GOAWAY, window updates; headers and data of streams ended before).
    ///
    /// Errors: the connection was closed or broke.
    fn catch_up(&mut self) -> Result<(), String> {
        self.catch_up_with(&mut Context::from_waker(Waker::noop()))
    }

    /// [`Conn::catch_up`], `cx` woken when more arrives.
    fn catch_up_with(&mut self, cx: &mut Context<'_>) -> Result<(), String> {
        loop {
            self.read.reserve(4096);
            let spare = self.read.spare_capacity_mut();
            let mut buf = ReadBuf::uninit(spare);
            match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Err("closed by the server".into()),
                Poll::Ready(Ok(())) => {
                    let n = buf.filled().len();
                    // SAFETY: poll_read initialised the first `n` bytes of the spare capacity.
                    unsafe { self.read.set_len(self.read.len() + n) };
                }
                Poll::Ready(Err(e)) => return Err(e.to_string()),
                Poll::Pending => break,
            }
        }
        while self.next_event()?.is_some() {}
        Ok(())
    }

    /// Whether an idle connection is to be kept, after reading what arrived on it and writing
    /// the acknowledgements that asks for (`cx` woken when more arrives): not when it ended, broke,
    /// or the server is going away.
    fn tend(&mut self, cx: &mut Context<'_>) -> bool {
        if self.catch_up_with(cx).is_err() || !self.usable() {
            return false;
        }
        if self.urgent {
            match Pin::new(&mut self.io).poll_write(cx, &self.out) {
                Poll::Ready(Ok(n)) if n == self.out.len() => {
                    self.out.clear();
                    self.urgent = false;
                }
                // Small frames that did not go out whole: not worth keeping the connection.
                Poll::Ready(_) => return false,
                Poll::Pending => {}
            }
        }
        true
    }

    /// One exchange on a new stream: the request (`block`, then `body`), the answer collected
    /// (its body at most `max_data` bytes). `reused`: the connection was taken idle, so a
    /// request that cannot be written did not reach the server.
    async fn exchange(&mut self, block: &[u8], body: &Bytes, max_data: usize, reused: bool) -> Result<Answer, Failure> {
        let result = self.run(block, body, max_data, reused).await;
        if result.is_err() {
            self.broken = true;
        } else if self.urgent {
            self.urgent = false;
            let written = self.io.write_all(&self.out).await;
            self.out.clear();
            self.broken = written.is_err();
        }
        result
    }

    async fn run(&mut self, block: &[u8], body: &Bytes, max_data: usize, reused: bool) -> Result<Answer, Failure> {
        let stream = self.next_stream;
        self.next_stream += 2;
        self.stream_window = self.initial_window;
        self.stream_unacked = 0;
        frame::put_headers(&mut self.out, stream, body.is_empty(), block, self.max_frame);
        let (mut sent, mut first_write) = (0, true);
        let mut head: Option<Response<()>> = None;
        let mut data = Body::new(max_data);
        loop {
            if sent < body.len() {
                let room = self.conn_window.min(self.stream_window).max(0) as usize;
                let n = room.min(body.len() - sent);
                if n > 0 {
                    frame::put_data(&mut self.out, stream, &body.slice(sent..sent + n), sent + n == body.len(), self.max_frame);
                    sent += n;
                    self.conn_window -= n as i64;
                    self.stream_window -= n as i64;
                }
            }
            if !self.out.is_empty() {
                if let Err(e) = self.io.write_all(&self.out).await {
                    let why = format!("cannot write the request: {e}");
                    return Err(if reused && first_write { Failure::Unprocessed(why) } else { Failure::Broken(why) });
                }
                self.out.clear();
                self.urgent = false;
                first_write = false;
            }
            let Some(event) = self.next_stream_event(stream, sent < body.len()).await? else { continue };
            match event {
                Event::Data { stream: s, end, data: chunk } if s == stream => {
                    data.push(chunk).map_err(|TooLarge| Failure::TooLarge)?;
                    if end {
                        let head = head.ok_or_else(|| Failure::Broken("DATA before the response headers".into()))?;
                        return self.answered(sent == body.len(), Answer { head, data: data.into_bytes(), trailers: None });
                    }
                    if self.stream_unacked >= STREAM_WINDOW / 2 {
                        frame::window_update(&mut self.out, stream, self.stream_unacked);
                        self.stream_unacked = 0;
                    }
                }
                Event::Headers { stream: s, end } if s == stream => match head {
                    None => {
                        let response = response_head(&self.fields).map_err(Failure::Broken)?;
                        if response.status().is_informational() {
                            continue;
                        }
                        if end {
                            return self.answered(sent == body.len(), Answer { head: response, data: Bytes::new(), trailers: None });
                        }
                        head = Some(response);
                    }
                    Some(head) if end => {
                        let data = data.into_bytes();
                        return self.answered(sent == body.len(), Answer { head, data, trailers: Some(header_map(&self.fields)) });
                    }
                    Some(_) => return Err(Failure::Broken("trailers without END_STREAM".into())),
                },
                Event::Reset { stream: s, reason: code } if s == stream => {
                    let why = format!("stream reset by the server: {}", reason_name(code));
                    return Err(if code == reason::REFUSED_STREAM { Failure::Unprocessed(why) } else { Failure::Broken(why) });
                }
                // Frames of streams ended before.
                _ => {}
            }
        }
    }

    /// The next frame event, read as needed; `None` when something is to be written first
    /// (acknowledgements, window updates, or — `sending` — request DATA the server's
    /// WINDOW_UPDATE made room for).
    ///
    /// Errors: the server broke the protocol or the connection; `Unprocessed` once a GOAWAY
    /// says the open stream (`stream`) was not processed.
    async fn next_stream_event(&mut self, stream: u32, sending: bool) -> Result<Option<Event>, Failure> {
        loop {
            if let Some(event) = self.next_event().map_err(Failure::Broken)? {
                return Ok(Some(event));
            }
            if let Some(last) = self.goaway.filter(|last| *last < stream) {
                return Err(Failure::Unprocessed(format!("the server is going away (GOAWAY, last stream {last})")));
            }
            if !self.out.is_empty() || (sending && self.conn_window.min(self.stream_window) > 0) {
                return Ok(None);
            }
            self.fill().await.map_err(Failure::Broken)?;
        }
    }

    /// The answer of the open stream; `sent_all`: the whole request went out. A server that
    /// answered before it did left the stream not cleanly closed: the connection is not used
    /// again.
    fn answered(&mut self, sent_all: bool, answer: Answer) -> Result<Answer, Failure> {
        self.broken |= !sent_all;
        Ok(answer)
    }

    /// Reads once more into `read`.
    ///
    /// Errors: the connection was closed or broke.
    async fn fill(&mut self) -> Result<(), String> {
        self.read.reserve(16 << 10);
        match self.io.read_buf(&mut self.read).await {
            Ok(0) => Err("connection closed by the server".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("connection broken: {e}")),
        }
    }

    /// Takes the next whole frame (a header block with its CONTINUATIONs) from `read`, handling
    /// the connection's own (SETTINGS, PING, WINDOW_UPDATE, GOAWAY) on the way; `None` when
    /// what was read ends before the next stream frame does.
    ///
    /// Errors: a protocol error of the server's, which ends the connection.
    fn next_event(&mut self) -> Result<Option<Event>, String> {
        loop {
            let Some((head, end)) = self.whole_frame()? else { return Ok(None) };
            let frame = self.read.split_to(end).freeze();
            let payload = frame.slice(HEAD_LEN..HEAD_LEN + head.len);
            match head.kind {
                kind::DATA => {
                    if head.stream == 0 {
                        return Err("DATA on stream 0".into());
                    }
                    self.received(head.len as u32);
                    let range = frame::unpadded(&head, &payload).ok_or("DATA padding longer than the frame")?;
                    return Ok(Some(Event::Data { stream: head.stream, end: head.has(flag::END_STREAM), data: payload.slice(range) }));
                }
                kind::HEADERS => {
                    let range = frame::unpadded(&head, &payload).ok_or("HEADERS padding longer than the frame")?;
                    let mut at = HEAD_LEN + head.len;
                    let joined;
                    let block = if at == frame.len() {
                        &payload[range]
                    } else {
                        // CONTINUATIONs follow: the fragments joined.
                        let mut b = BytesMut::from(&payload[range]);
                        while at < frame.len() {
                            let next = Head::parse(&frame[at..]);
                            b.extend_from_slice(&frame[at + HEAD_LEN..at + HEAD_LEN + next.len]);
                            at += HEAD_LEN + next.len;
                        }
                        joined = b;
                        &joined[..]
                    };
                    self.hpack
                        .decode(block, &mut self.fields, MAX_FIELDS, MAX_HEADER_LIST_SIZE as usize)
                        .map_err(|e| format!("answer headers: {e}"))?;
                    return Ok(Some(Event::Headers { stream: head.stream, end: head.has(flag::END_STREAM) }));
                }
                kind::RST_STREAM if payload.len() == 4 => {
                    let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                    return Ok(Some(Event::Reset { stream: head.stream, reason: code }));
                }
                kind::SETTINGS if !head.has(flag::ACK) => {
                    for (id, value) in frame::settings_entries(&payload) {
                        self.setting(id, value)?;
                    }
                    frame::settings_ack(&mut self.out);
                    self.urgent = true;
                }
                kind::PING if payload.len() == 8 && !head.has(flag::ACK) => {
                    let mut opaque = [0; 8];
                    opaque.copy_from_slice(&payload);
                    frame::ping(&mut self.out, true, &opaque);
                    self.urgent = true;
                }
                // Its acknowledgement.
                kind::PING if payload.len() == 8 => {}
                kind::GOAWAY if payload.len() >= 8 => {
                    self.goaway = Some(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & LAST_STREAM_ID);
                }
                kind::WINDOW_UPDATE if payload.len() == 4 => {
                    let increment = i64::from(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & LAST_STREAM_ID);
                    if head.stream == 0 {
                        self.conn_window += increment;
                    } else if head.stream + 2 == self.next_stream {
                        self.stream_window += increment;
                    }
                }
                kind::RST_STREAM | kind::PING | kind::GOAWAY | kind::WINDOW_UPDATE => {
                    return Err(format!("frame of type {} with a {}-byte payload", head.kind, head.len))
                }
                kind::PUSH_PROMISE => return Err("PUSH_PROMISE, though push is disabled".into()),
                kind::CONTINUATION => return Err("CONTINUATION without HEADERS".into()),
                // SETTINGS and PING acknowledgements, PRIORITY, unknown types (§5.5).
                _ => {}
            }
        }
    }

    /// The header of the next frame in `read` and where it ends (a HEADERS frame without
    /// END_HEADERS: its last CONTINUATION), if it is there whole.
    ///
    /// Errors: a frame over the 16,384 bytes allowed; a header block interrupted by another
    /// frame, or longer than the header list allowed.
    fn whole_frame(&self) -> Result<Option<(Head, usize)>, String> {
        let Some(head) = self.head_at(0)? else { return Ok(None) };
        let mut end = HEAD_LEN + head.len;
        if self.read.len() < end {
            return Ok(None);
        }
        if head.kind != kind::HEADERS || head.has(flag::END_HEADERS) {
            return Ok(Some((head, end)));
        }
        loop {
            if end > MAX_HEADER_LIST_SIZE as usize {
                return Err("header block larger than the header list allowed".into());
            }
            let Some(next) = self.head_at(end)? else { return Ok(None) };
            if next.kind != kind::CONTINUATION || next.stream != head.stream {
                return Err("header block interrupted by another frame".into());
            }
            end += HEAD_LEN + next.len;
            if self.read.len() < end {
                return Ok(None);
            }
            if next.has(flag::END_HEADERS) {
                return Ok(Some((head, end)));
            }
        }
    }

    /// The frame header at `at` in `read`, if read.
    ///
    /// Errors: a frame over the 16,384 bytes allowed.
    fn head_at(&self, at: usize) -> Result<Option<Head>, String> {
        if self.read.len() < at + HEAD_LEN {
            return Ok(None);
        }
        let head = Head::parse(&self.read[at..]);
        if head.len > DEFAULT_MAX_FRAME {
            return Err(format!("frame of {} bytes, above the {DEFAULT_MAX_FRAME} allowed", head.len));
        }
        Ok(Some(head))
    }

    /// Counts received DATA against the connection's window, and the open stream's.
    fn received(&mut self, len: u32) {
        self.conn_unacked += len;
        self.stream_unacked += len;
        if self.conn_unacked >= CONNECTION_WINDOW / 2 {
            frame::window_update(&mut self.out, 0, self.conn_unacked);
            self.conn_unacked = 0;
        }
    }

    /// Applies one of the server's settings.
    ///
    /// Errors: values RFC 9113 §6.5.2 does not allow.
    fn setting(&mut self, id: u16, value: u32) -> Result<(), String> {
        match id {
            setting::INITIAL_WINDOW_SIZE => {
                let value = i64::from(value);
                if value > i64::from(LAST_STREAM_ID) {
                    return Err(format!("SETTINGS_INITIAL_WINDOW_SIZE {value} above 2^31 - 1"));
                }
                // A change applies to the open stream's window too (§6.9.2).
                self.stream_window += value - self.initial_window;
                self.initial_window = value;
            }
            setting::MAX_FRAME_SIZE => {
                if !(DEFAULT_MAX_FRAME as u32..1 << 24).contains(&value) {
                    return Err(format!("SETTINGS_MAX_FRAME_SIZE {value} outside 16384..2^24"));
                }
                self.max_frame = value as usize;
            }
            _ => {}
        }
        Ok(())
    }
}

/// A response head from a decoded header block: its `:status` and its fields (pseudo-header
/// fields other than `:status`, and fields `http` cannot hold, left out).
///
/// Errors: no `:status`, or one that is not a status code.
fn response_head(fields: &hpack::Fields) -> Result<Response<()>, String> {
    let status = fields.get(b":status").ok_or("response headers without :status")?;
    let status =
        StatusCode::from_bytes(status).map_err(|_| format!(":status {:?} is not a status code", String::from_utf8_lossy(status)))?;
    let mut head = Response::new(());
    *head.status_mut() = status;
    *head.headers_mut() = header_map(fields);
    Ok(head)
}

/// The regular fields of a decoded header block as a header map.
fn header_map(fields: &hpack::Fields) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields.iter() {
        if name.first() == Some(&b':') {
            continue;
        }
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            map.append(name, value);
        }
    }
    map
}

/// An HTTP/2 error code's name (RFC 9113 §7).
fn reason_name(code: u32) -> String {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    NAMES.get(code as usize).map_or_else(|| format!("error code {code}"), |n| (*n).to_owned())
}

#[cfg(test)]
#[path = "hook_client_tests.rs"]
mod tests;
