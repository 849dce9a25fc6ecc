//! The CRI front end: each client connection is relayed, frame by frame, over a runtime
//! connection of its own; the calls hooks need are intercepted on the way.
//!
//! **Relayed calls** (everything but the hooked methods): their frames go on as they came, in
//! one task per client connection that reads both sockets — no HTTP/2 stack re-encodes them,
//! and no task hop lies between a read and the write that forwards it. The client's header
//! blocks reach the runtime verbatim (the client's HPACK encoder and the runtime's decoder stay
//! in step because every block of the client's goes through, in order); the relay decodes
//! each block to learn the method and the `grpc-timeout`, and the runtime's blocks to learn
//! the call's `grpc-status`. SETTINGS, PING, WINDOW_UPDATE, GOAWAY and RST_STREAM pass
//! through, so flow control and keepalive are the two peers' own, as without the proxy; the
//! relay only caps SETTINGS_MAX_CONCURRENT_STREAMS at `--max-concurrent-streams`.
//!
//! **Intercepted calls** ([`Route::Intercept`]): the header block goes on in its place among
//! the client's blocks (HPACK order), but is written together with the body, the body is held
//! and handed to the interceptor's task; when the pre stage is done the task hands back the
//! body (edited by the hooks, or as it was) and the relay sends it on the same stream. So the
//! runtime wakes up once per call, for a whole request, not once for the head and again for
//! the body: the runtime-bound bytes are not written while they are only such header blocks,
//! and go out with whatever comes next (the body, a reset, any other frame). The
//! answer is relayed as any other, and a copy goes to the task, which records it in the store
//! and runs the post stage (calls for one pod wait for each other in the interceptor, so the
//! next call of a pod sees the store updated). A call the pre stage refuses is answered by the
//! relay and reset at the runtime before any message reached it.
//!
//! **Taken-over calls** ([`Route::Unary`]): ImageService calls when images are served by another
//! socket, and calls on a connection whose runtime connection is gone: the header block goes on
//! (to keep HPACK in step) and the runtime's stream is reset (CANCEL) at once; a task sends the
//! call over the shared [`Backend`] connection and the relay writes its answer back.
//!
//! **Bytes of the relay's own**: header blocks it writes are literal, never indexed
//! ([`frame::put_literal`]), so they fit anywhere in the connection; once the runtime sends a
//! block the relay cannot forward (an answer on a stream it took over), all later blocks to the
//! client are written that way too. DATA the relay writes of its own (an edited request, a
//! taken-over answer) takes room in a peer's window the other peer does not know of: the relay
//! counts each connection window, holds back that much of the other peer's WINDOW_UPDATE
//! credit, and holds a frame the receiver has no room for until it has (reading on behind it,
//! and applying at once the connection-level WINDOW_UPDATEs that come behind it: frames held
//! both ways never wait on each other); DATA it takes without forwarding (a held request body)
//! is credited back to the sender: a stream's credit at once, the connection's with the next
//! bytes the client is written anyway (its answer), or at once when it reaches
//! [`CREDIT_BATCH`], so a lone WINDOW_UPDATE does not wake the client up per call.
//! DATA the relay writes the client of its own also waits until the runtime's ACK of every
//! SETTINGS the client sent has gone to the client, as a server's ACK precedes the DATA it
//! sends under new settings (a client may apply a new stream window only on the ACK).
//!
//! **Statuses of the proxy's own**: a relayed call still waiting for its response head when its
//! `grpc-timeout` passes is answered `DEADLINE_EXCEEDED` and reset at the runtime; when the
//! runtime's connection breaks, every call in flight ends `UNAVAILABLE` naming the socket (as
//! trailers once its head went out), and the connection goes on serving new calls by taking
//! each over (`UNAVAILABLE` naming the socket while the runtime is down) — the relay is then the
//! client's HTTP/2 peer (SETTINGS and PING acknowledged) — and once a call finds the runtime
//! reachable again, it sends GOAWAY the graceful way (GOAWAY, PING, then the final GOAWAY once
//! acknowledged) so the client comes back on a new connection, relayed again. A client
//! connection accepted while the runtime is down starts in that state. Server streams
//! (GetContainerEvents, KEP-5825's `Stream*` lists: [`crate::cri::newer_cri::is_server_stream`]) are
//! answered `UNAVAILABLE` meanwhile: taken over as one unary call, their messages would wait
//! for their end.
//!
//! **Shutdown** (`stop`): graceful GOAWAY, then the connection ends once its calls have.
//!
//! # Parts
//!
//! * this file — [`serve_connection`], the socket loop (`Relay`), [`Core`]'s state and its
//!   public face (bytes in, bytes out), and `Peer`: what the relay knows of each side.
//! * `from_client`, `from_runtime` — each side's frames, DATA and header blocks.
//! * `flow_control` — connection windows, frames held for room, WINDOW_UPDATEs read ahead.
//! * `streams` — the stream table: each call in flight, its deadline, how it ends.
//! * `take_over` — intercepted and taken-over calls: their tasks, commands and answers.
//! * `shutdown` — graceful GOAWAY, a lost runtime connection, connection errors.
//! * `header_block` — header blocks assembled, decoded and written.

mod flow_control;
mod from_client;
mod from_runtime;
mod header_block;
mod shutdown;
mod streams;
mod take_over;
#[cfg(test)]
mod tests;

pub use flow_control::CREDIT_BATCH;

use flow_control::*;
use header_block::*;
use shutdown::*;
use streams::*;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Method, Request, Response};
use tokio::io::AsyncWrite;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Sleep;
use tokio_util::task::TaskTracker;

use crate::cri::intercept::{self, RequestBody};
use crate::cri::router::{self, Route, Router};
use crate::grpc::backend::{Backend, MAX_HEADER_LIST_SIZE};
use crate::grpc::unary_call::{self, Answer, Onward};
use crate::grpc::{self, Code, Status, StatusHeaders};
use crate::http2::frame::{self, flag, kind, reason, setting, Head, HEAD_LEN};
use crate::http2::hpack::{self, Fields};
use daemon_support::uds::Socket;
/// Bytes waiting to be written to one side above which the relay stops reading the other.
const HIGH_WATER: usize = 1 << 20;

/// The opaque data of the PING the relay sends between its two GOAWAY frames.
const CLOSING_PING: [u8; 8] = *b"rp-close";

/// Most fields a header block may decode to (gRPC calls carry a dozen); a larger one ends the
/// connection (it cannot go on: the HPACK state is lost), as one over `MAX_HEADER_LIST_SIZE`
/// decoded bytes does.
const MAX_FIELDS: usize = 4096;

/// Most bytes of an intercepted call's answer copied for the interceptor (which reads one ID
/// from it); a longer answer still goes to the client whole.
const ANSWER_COPY_LIMIT: usize = 16 << 20;

/// Serves one client connection until it ends (see the module docs). `max_streams`: most calls
/// at once on it (`--max-concurrent-streams`); `stop` turns true at shutdown; intercepted and
/// taken-over calls run as tasks of `tasks`.
pub async fn serve_connection(
    client: UnixStream,
    router: Arc<Router>,
    tasks: TaskTracker,
    stop: watch::Receiver<bool>,
    max_streams: u32,
) {
    let client = match Socket::new(client) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register client connection");
            return;
        }
    };
    let runtime = router.runtime();
    let (backend, gone) =
        match runtime.dial_raw().await.and_then(|s| Socket::new(s).map_err(|e| unavailable(runtime, &e))) {
            Ok(s) => (Some(s), None),
            Err(status) => (None, Some(status.message)),
        };
    let mut stop = stop;
    let stopped: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    });
    let core = Core::new(router, tasks, max_streams, backend.is_some(), gone);
    let mut relay = Relay { core, client, backend, stopped };
    poll_fn(|cx| relay.poll_run(cx)).await;
    relay.core.finish();
}

fn unavailable(backend: &Backend, e: &dyn std::fmt::Display) -> Status {
    Status::new(Code::UNAVAILABLE, format!("{backend}: cannot connect: {e}"))
}

/// What a call's task asks of the relay.
enum Command {
    /// Send this body on the intercepted stream, and the runtime's answer back.
    Send { stream: u32, body: Bytes, answer: oneshot::Sender<Result<Answer, Status>> },
    /// Answer the intercepted stream with this status (its runtime stream is reset).
    Fail { stream: u32, status: Status },
    /// Write this answer of a taken-over call to the client.
    Reply { stream: u32, answer: Result<Answer, Status> },
    /// Whether the runtime took a connection, while there is none to relay on.
    Probed { up: bool },
}

/// One peer of a relayed connection (the client, or the runtime), as the relay sees it: what it
/// read from the peer and has not handled yet, the peer's header-block state, and the room the
/// peer gives for what the relay sends it.
struct Peer {
    /// Bytes read from the peer, not yet handled.
    input: BytesMut,
    /// Decodes the peer's header blocks (the peer's encoder's table, as the other peer's decoder
    /// has it).
    hpack: hpack::Decoder,
    /// The peer's header block being collected.
    block: Option<PendingHeaderBlock>,
    /// A DATA frame of the peer's waiting for room in the other peer's connection window.
    held: Option<(Head, BytesMut)>,
    /// Bytes of `input` behind the held frame already looked through for WINDOW_UPDATEs
    /// ([`Core::window_updates_ahead`]); 0 when a frame starts being held.
    scanned: usize,
    /// The peer's connection-level window, as the relay sends to it.
    window: Window,
    /// The peer's SETTINGS_INITIAL_WINDOW_SIZE: a new stream's room for what is sent to it.
    initial_window: i64,
    /// The largest frame the peer takes (SETTINGS_MAX_FRAME_SIZE).
    max_frame: usize,
}

impl Peer {
    fn new() -> Peer {
        Peer {
            input: BytesMut::with_capacity(16 << 10),
            hpack: hpack::Decoder::default(),
            block: None,
            held: None,
            scanned: 0,
            window: Window::default(),
            initial_window: frame::DEFAULT_WINDOW,
            max_frame: frame::DEFAULT_MAX_FRAME,
        }
    }
}

/// A relayed connection's state and frame handling, without the sockets: bytes read are handed
/// to [`Core::client_input`] and [`Core::backend_input`], and what is to be written waits in
/// [`Core::to_client`] and [`Core::to_backend`]. (Public for the fuzz target in `fuzz/`.)
pub struct Core {
    router: Arc<Router>,
    runtime: Arc<Backend>,
    tasks: TaskTracker,
    max_streams: u32,
    /// There is a runtime connection (false once it broke or when it could not be dialled).
    connected: bool,
    /// Why there is no runtime connection (for the statuses of calls answered meanwhile).
    gone: Option<String>,
    /// What the relay knows of the client: bytes read from it, its header blocks, its window.
    client: Peer,
    /// The same of the runtime.
    backend: Peer,
    /// Bytes to write to the client.
    pub to_client: BytesMut,
    /// Bytes to write to the runtime.
    pub to_backend: BytesMut,
    /// `to_backend` holds this many bytes and nothing else: header blocks of intercepted calls
    /// whose bodies are not there yet; not written until other bytes join them (0: none held).
    held_heads: usize,
    /// Connection-level credit the client is owed for intercepted bodies, not yet written (at
    /// most [`CREDIT_BATCH`]).
    client_credit: u32,
    /// The client's preface was read.
    preface: bool,
    /// The last decoded block (reused).
    headers: Fields,
    /// The runtime's header blocks still go to the client as they came.
    b_verbatim: bool,
    /// By stream ID (few at once: a B-tree needs no hashing).
    streams: BTreeMap<u32, Stream>,
    /// The highest stream the client opened.
    last_stream: u32,
    /// The runtime's SETTINGS reached the client.
    backend_settings: bool,
    /// The client's SETTINGS frames sent on to the runtime whose ACK has not reached the client
    /// yet. Meanwhile the relay writes the client no DATA of its own (taken-over answers): a
    /// client applies a new SETTINGS_INITIAL_WINDOW_SIZE to what it receives only once it has
    /// the ACK (h2 does, RFC 9113 §6.5.3 allows it), so DATA sized to the new window that comes
    /// before the ACK is counted against the old one, and the client's WINDOW_UPDATE for it
    /// may never come. A server's ACK always precedes the DATA it sends under new settings.
    client_settings_unacked: u32,
    /// A task is dialling the runtime to learn whether it is back (no runtime connection).
    probing: bool,
    commands_tx: mpsc::UnboundedSender<Command>,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Relayed calls that ended, to record ([`Core::after_write`]).
    ended: Vec<(Box<str>, Status, std::time::Duration)>,
    /// The runtime's header blocks that went on before they were decoded, with the call each
    /// ended, if any ([`Core::after_write`]).
    undecoded: Vec<Undecoded>,
    /// The blocks of `undecoded`, one after the other.
    undecoded_bytes: Vec<u8>,
    timer: Option<Pin<Box<Sleep>>>,
    /// A timer was set or a task started since the last look at them: both must be polled
    /// once (a new timer to have the waker, the command channel so a task's command wakes the
    /// relay).
    aux_due: bool,
    next_deadline: Option<Instant>,
    stopping: bool,
    closing: Closing,
    /// The connection is over (the client went away, or a connection error).
    done: bool,
}

/// A [`Core`] and its two sockets.
struct Relay {
    core: Core,
    client: Socket,
    /// The runtime connection; `None` once it broke or when it could not be dialled.
    backend: Option<Socket>,
    stopped: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// A runtime header block that went on before it was decoded (where it lies in
/// `Core::undecoded_bytes`), and the call it ended, if any.
type Undecoded = (std::ops::Range<usize>, Option<(Box<str>, std::time::Duration)>);

/// The two peers of a relayed connection.
#[derive(Clone, Copy)]
enum Side {
    Client,
    Backend,
}

/// A connection error: GOAWAY with `reason` to the client, then the connection ends.
struct Fatal(u32, &'static str);

impl Relay {
    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut first = true;
        // A socket whose read came back Pending in this poll has the task's waker: what it
        // receives from now on wakes the relay for another poll, so it is not read again in
        // this one (each read that finds nothing costs a readiness check and a waker update).
        let (mut client_waits, mut backend_waits) = (false, false);
        loop {
            let mut busy = false;
            self.flush(cx);
            if self.core.done {
                return Poll::Ready(());
            }
            let room = self.core.to_backend.len() < HIGH_WATER && self.core.to_client.len() < HIGH_WATER;
            // With a frame held, reading goes on up to HIGH_WATER and one whole frame more (see
            // `window_updates_ahead`).
            let c_room = self.core.client.held.is_none()
                || self.core.client.input.len() < HIGH_WATER + self.core.backend.max_frame;
            let b_room = self.core.backend.held.is_none()
                || self.core.backend.input.len()
                    < HIGH_WATER + self.core.client.max_frame.max(frame::DEFAULT_MAX_FRAME);
            if c_room && room && !client_waits {
                match read(&mut self.client, &mut self.core.client.input, cx) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        self.core.client_gone();
                        return Poll::Ready(());
                    }
                    Poll::Ready(Ok(_)) => {
                        busy = true;
                        self.core.client_read();
                        self.flush(cx);
                    }
                    Poll::Pending => client_waits = true,
                }
            }
            if b_room && room && !backend_waits {
                let got = match &mut self.backend {
                    Some(backend) => read(backend, &mut self.core.backend.input, cx),
                    None => Poll::Pending,
                };
                match got {
                    Poll::Ready(Ok(0)) => {
                        busy = true;
                        self.core.backend_lost("the connection was closed".into());
                    }
                    Poll::Ready(Err(e)) => {
                        busy = true;
                        self.core.backend_lost(e.to_string());
                    }
                    Poll::Ready(Ok(_)) => {
                        busy = true;
                        self.core.backend_read();
                        self.flush(cx);
                    }
                    Poll::Pending => backend_waits = true,
                }
            }
            if !self.core.connected {
                self.backend = None;
            }
            // The calls' tasks, the deadline timer and shutdown, once per wake-up: each keeps
            // the task's waker from its last poll, so what happens to them wakes the relay up
            // for another turn (a new timer or task: see `aux_due`). Commands are only looked
            // for while a task can send one or one is waiting.
            if first || self.core.aux_due {
                first = false;
                if self.core.commands_tx.strong_count() > 1 || !self.core.commands.is_empty() {
                    while let Poll::Ready(Some(command)) = self.core.commands.poll_recv(cx) {
                        busy = true;
                        self.core.on_command(command);
                    }
                }
                self.core.aux_due = false;
                if let Some(timer) = &mut self.core.timer {
                    if timer.as_mut().poll(cx).is_ready() {
                        busy = true;
                        self.core.timer = None;
                        self.core.expire_deadlines();
                    }
                }
                if !self.core.stopping && self.stopped.as_mut().poll(cx).is_ready() {
                    busy = true;
                    self.core.stop();
                }
            }
            if self.core.finished() {
                self.core.done = true;
            }
            if !busy && !self.core.done {
                self.flush(cx);
                self.core.after_write();
                if !self.core.done {
                    return Poll::Pending;
                }
            }
        }
    }

    /// Writes what is waiting for either side, as far as the sockets take it: to the client
    /// with the credit it is owed, to the runtime unless it is only held header blocks.
    fn flush(&mut self, cx: &mut Context<'_>) {
        if !self.core.to_client.is_empty() {
            self.core.settle_credit();
            if write(&mut self.client, &mut self.core.to_client, cx).is_err() {
                self.core.client_gone();
            }
        }
        if let Some(backend) = &mut self.backend {
            if self.core.backend_due() {
                self.core.held_heads = 0;
                if let Err(e) = write(backend, &mut self.core.to_backend, cx) {
                    self.core.backend_lost(e.to_string());
                    self.backend = None;
                }
            }
        }
    }
}

fn read(socket: &mut Socket, buf: &mut BytesMut, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 << 10);
    }
    tokio_util::io::poll_read_buf(Pin::new(socket), cx, buf)
}

/// Writes as much of `buf` as the socket takes now; `Err` when the peer is gone.
fn write(socket: &mut Socket, buf: &mut BytesMut, cx: &mut Context<'_>) -> std::io::Result<()> {
    while !buf.is_empty() {
        match Pin::new(&mut *socket).poll_write(cx, buf) {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => buf.advance(n),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(()),
        }
    }
    Ok(())
}

impl Core {
    /// A connection's state: `connected` when there is a runtime connection to relay on.
    /// `max_streams`: most calls at once (`--max-concurrent-streams`); intercepted and
    /// taken-over calls run as tasks of `tasks`.
    pub fn new(
        router: Arc<Router>,
        tasks: TaskTracker,
        max_streams: u32,
        connected: bool,
        gone: Option<String>,
    ) -> Core {
        let runtime = router.runtime().clone();
        let (commands_tx, commands) = mpsc::unbounded_channel();
        Core {
            router,
            runtime,
            tasks,
            max_streams,
            connected,
            gone,
            client: Peer::new(),
            backend: Peer::new(),
            to_client: BytesMut::with_capacity(16 << 10),
            to_backend: BytesMut::with_capacity(16 << 10),
            held_heads: 0,
            client_credit: 0,
            preface: false,
            headers: Fields::default(),
            b_verbatim: true,
            streams: BTreeMap::new(),
            last_stream: 0,
            backend_settings: false,
            client_settings_unacked: 0,
            probing: false,
            commands_tx,
            commands,
            ended: Vec::new(),
            undecoded: Vec::new(),
            undecoded_bytes: Vec::new(),
            timer: None,
            aux_due: false,
            next_deadline: None,
            stopping: false,
            closing: Closing::Open,
            done: false,
        }
    }

    /// Takes bytes the client sent (as read from its socket).
    pub fn client_input(&mut self, data: &[u8]) {
        self.client.input.extend_from_slice(data);
        self.client_read();
    }

    /// Takes bytes the runtime sent (as read from its socket).
    pub fn backend_input(&mut self, data: &[u8]) {
        self.backend.input.extend_from_slice(data);
        self.backend_read();
    }

    /// Runs what the calls' tasks asked for so far.
    pub fn run_commands(&mut self) {
        while let Ok(command) = self.commands.try_recv() {
            self.on_command(command);
        }
    }

    /// Whether the connection is over: a connection error, the client gone, or closed and
    /// drained.
    pub fn finished(&self) -> bool {
        self.done || (matches!(self.closing, Closing::Final(_)) && self.streams.is_empty() && self.to_client.is_empty())
    }

    /// Whether `to_backend` is to be written now: it holds bytes, and not only header blocks
    /// held for their bodies.
    pub fn backend_due(&self) -> bool {
        !self.to_backend.is_empty() && self.to_backend.len() != self.held_heads
    }

    /// Appends the connection-level credit the client is owed to what it is written.
    pub fn settle_credit(&mut self) {
        if self.client_credit > 0 {
            frame::window_update(&mut self.to_client, 0, std::mem::take(&mut self.client_credit));
        }
    }

    fn client_read(&mut self) {
        if let Err(Fatal(code, why)) = self.client_bytes() {
            self.fatal(code, why);
        }
    }

    fn backend_read(&mut self) {
        if let Err(Fatal(_, why)) = self.backend_bytes() {
            self.backend_lost(format!("protocol error: {why}"));
        }
    }

    // ===== client → runtime =====

    /// Decodes the runtime's header blocks that went on undecoded (in order, before any later
    /// block), and learns the status of the calls they ended.
    ///
    /// Errors: a block that does not decode (the runtime connection cannot go on).
    fn decode_undecoded(&mut self) -> Result<(), Fatal> {
        let mut result = Ok(());
        let (mut blocks, mut bytes) = (std::mem::take(&mut self.undecoded), std::mem::take(&mut self.undecoded_bytes));
        for (range, ended) in blocks.drain(..) {
            let status = match result {
                Ok(()) => match decode(&mut self.backend.hpack, &bytes[range], &mut self.headers) {
                    Ok(()) => status_of(&self.headers),
                    Err(e) => {
                        result = Err(e);
                        Status::new(Code::UNKNOWN, "the backend's trailers could not be decoded")
                    }
                },
                Err(_) => Status::new(Code::UNKNOWN, "the backend's trailers could not be decoded"),
            };
            if let Some((method, elapsed)) = ended {
                self.ended.push((method, status, elapsed));
            }
        }
        // The buffers go back, empty, for the next blocks.
        bytes.clear();
        (self.undecoded, self.undecoded_bytes) = (blocks, bytes);
        result
    }

    /// What waits until the bytes at hand are written: decoding the runtime's blocks that went
    /// on undecoded, and recording the relayed calls that ended (metrics and the call log).
    pub fn after_write(&mut self) {
        if let Err(Fatal(_, why)) = self.decode_undecoded() {
            self.backend_lost(format!("protocol error: {why}"));
        }
        for (method, status, elapsed) in self.ended.drain(..) {
            self.router.record(&method, &status, elapsed);
        }
    }

    /// Queues `raw` for the runtime, if there is a runtime connection.
    fn send_backend(&mut self, raw: &[u8]) {
        if self.connected {
            self.to_backend.extend_from_slice(raw);
        }
    }
}
