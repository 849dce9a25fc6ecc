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

use crate::grpc::backend::{Backend, MAX_HEADER_LIST_SIZE};
use crate::cri::frame::{self, flag, kind, reason, setting, Head, HEAD_LEN};
use crate::grpc::{self, Code, Status};
use crate::cri::hpack::{self, Fields};
use crate::cri::intercept::{self, Onward, RequestBody};
use crate::cri::router::{self, Route, Router};
use crate::cri::uds::Socket;
use crate::grpc::unary_call::Answer;

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
pub async fn serve_connection(client: UnixStream, router: Arc<Router>, tasks: TaskTracker, stop: watch::Receiver<bool>, max_streams: u32) {
    let client = match Socket::new(client) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register client connection");
            return;
        }
    };
    let runtime = router.runtime();
    let (backend, gone) = match runtime.dial_raw().await.and_then(|s| Socket::new(s).map_err(|e| unavailable(runtime, &e))) {
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

/// How far the graceful GOAWAY has gone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Closing {
    Open,
    /// GOAWAY(2^31 − 1) and the PING sent; waiting for its ACK.
    Pinged,
    /// The final GOAWAY sent: streams above this one are not served.
    Final(u32),
}

/// Connection-level credit for request bodies the relay took (intercepted calls) that may wait
/// for the next bytes written to the client anyway: a quarter of HTTP/2's default window
/// (65,535 bytes), so the client always has most of its window.
pub const CREDIT_BATCH: u32 = (frame::DEFAULT_WINDOW / 4) as u32;

/// A peer's connection-level flow-control window, as the relay sends to it.
struct Window {
    /// Room left (bytes): what the peer granted minus what it was sent.
    room: i64,
    /// DATA bytes the relay sent the peer of its own, whose credit (the peer's WINDOW_UPDATEs
    /// for them) must not reach the other peer.
    debt: u64,
}

impl Default for Window {
    fn default() -> Self {
        Window { room: frame::DEFAULT_WINDOW, debt: 0 }
    }
}

impl Window {
    /// The peer granted `increment` more: returns what of it is the other peer's (to forward).
    fn granted(&mut self, increment: u32) -> u32 {
        self.room += i64::from(increment);
        let held = self.debt.min(u64::from(increment));
        self.debt -= held;
        increment - held as u32
    }
}

/// A header block being collected (HEADERS, then CONTINUATION until END_HEADERS).
struct PendingHeaderBlock {
    stream: u32,
    /// The HEADERS frame's flags (END_STREAM).
    flags: u8,
    /// The frames as they came, to forward verbatim.
    raw: Vec<u8>,
    /// The block itself (fragments without padding and priority), to decode.
    fragment: Vec<u8>,
}

/// A whole header block ([`assemble`]).
struct HeaderBlock<'a> {
    stream: u32,
    /// The HEADERS frame's flags (END_STREAM).
    flags: u8,
    /// The block's frames as they came.
    raw: Cow<'a, [u8]>,
    /// The block itself, to decode (borrowed when the block is one frame).
    fragment: Cow<'a, [u8]>,
}

/// One call in flight.
struct Stream {
    method: Box<str>,
    start: Instant,
    /// The response head went to the client.
    head_sent: bool,
    kind: StreamKind,
}

enum StreamKind {
    /// Forwarded as it is; `deadline`: the caller's (`grpc-timeout`), enforced until the head.
    Relayed {
        deadline: Option<Instant>,
    },
    Intercepted(Box<Intercepted>),
    TakenOver(Box<TakenOver>),
}

/// The relay's side of a call's task: where its request body goes.
struct Task {
    /// Where the body goes; `None` once it ended (or the task stopped taking it).
    body: Option<mpsc::UnboundedSender<Result<Bytes, Status>>>,
    /// Sent to when the client reset the call or went away (dropped unsent otherwise).
    cancel: Option<oneshot::Sender<()>>,
    /// The client sent END_STREAM.
    client_done: bool,
}

struct Intercepted {
    task: Task,
    /// The body to send on, as far as not yet sent.
    outgoing: Option<Bytes>,
    /// Room in the runtime's window for this stream.
    window: i64,
    /// Where the answer goes, once whole.
    answer: Option<oneshot::Sender<Result<Answer, Status>>>,
    /// The interceptor handed the body back (the pre stage is done).
    sent: bool,
    /// The client's END_STREAM already went to the runtime (on its HEADERS, or on trailers,
    /// which go on at once): nothing can follow it, the body is not sent.
    upstream_closed: bool,
    /// The answer so far, as relayed to the client.
    head: Option<Response<()>>,
    data: BytesMut,
    /// The answer was too long to copy whole ([`ANSWER_COPY_LIMIT`]).
    data_cut: bool,
    /// The caller's deadline (`grpc-timeout`), enforced once the body went on, until the head.
    deadline: Option<Instant>,
    /// What the runtime answered before the pre stage was done (an encoding it does not
    /// take, say), held for the client until it is: frames, and the whole answer.
    early: BytesMut,
    early_answer: Option<Result<Answer, Status>>,
}

struct TakenOver {
    task: Task,
    /// Room in the client's window for this stream.
    window: i64,
    /// The answer, as far as it is not written yet.
    reply: Option<PendingReply>,
    /// The answer was written whole.
    replied: bool,
}

struct PendingReply {
    head: Option<BytesMut>,
    data: Bytes,
    trailers: Option<BytesMut>,
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
    c_in: BytesMut,
    b_in: BytesMut,
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
    /// Decodes the client's header blocks (its encoder's table, as the runtime's decoder has it).
    c_hpack: hpack::Decoder,
    /// Decodes the runtime's header blocks.
    b_hpack: hpack::Decoder,
    /// The last decoded block (reused).
    headers: Fields,
    /// The runtime's header blocks still go to the client as they came.
    b_verbatim: bool,
    c_block: Option<PendingHeaderBlock>,
    b_block: Option<PendingHeaderBlock>,
    /// A client DATA frame waiting for room in the runtime's connection window.
    c_held: Option<(Head, BytesMut)>,
    /// A runtime DATA frame waiting for room in the client's connection window.
    b_held: Option<(Head, BytesMut)>,
    /// Bytes of `c_in` (and `b_in`) behind the held frame already looked through for
    /// WINDOW_UPDATEs ([`Core::window_updates_ahead`]); 0 when a frame starts being held.
    c_scanned: usize,
    b_scanned: usize,
    /// By stream ID (few at once: a B-tree needs no hashing).
    streams: BTreeMap<u32, Stream>,
    /// The highest stream the client opened.
    last_stream: u32,
    client_window: Window,
    backend_window: Window,
    client_initial_window: i64,
    backend_initial_window: i64,
    client_max_frame: usize,
    backend_max_frame: usize,
    /// The runtime's SETTINGS reached the client.
    backend_settings: bool,
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
            let c_room = self.core.c_held.is_none() || self.core.c_in.len() < HIGH_WATER + self.core.backend_max_frame;
            let b_room =
                self.core.b_held.is_none() || self.core.b_in.len() < HIGH_WATER + self.core.client_max_frame.max(frame::DEFAULT_MAX_FRAME);
            if c_room && room && !client_waits {
                match read(&mut self.client, &mut self.core.c_in, cx) {
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
                    Some(backend) => read(backend, &mut self.core.b_in, cx),
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

impl Core {
    /// A connection's state: `connected` when there is a runtime connection to relay on.
    /// `max_streams`: most calls at once (`--max-concurrent-streams`); intercepted and
    /// taken-over calls run as tasks of `tasks`.
    pub fn new(router: Arc<Router>, tasks: TaskTracker, max_streams: u32, connected: bool, gone: Option<String>) -> Core {
        let runtime = router.runtime().clone();
        let (commands_tx, commands) = mpsc::unbounded_channel();
        Core {
            router,
            runtime,
            tasks,
            max_streams,
            connected,
            gone,
            c_in: BytesMut::with_capacity(16 << 10),
            b_in: BytesMut::with_capacity(16 << 10),
            to_client: BytesMut::with_capacity(16 << 10),
            to_backend: BytesMut::with_capacity(16 << 10),
            held_heads: 0,
            client_credit: 0,
            preface: false,
            c_hpack: hpack::Decoder::default(),
            b_hpack: hpack::Decoder::default(),
            headers: Fields::default(),
            b_verbatim: true,
            c_block: None,
            b_block: None,
            c_held: None,
            b_held: None,
            c_scanned: 0,
            b_scanned: 0,
            streams: BTreeMap::new(),
            last_stream: 0,
            client_window: Window::default(),
            backend_window: Window::default(),
            client_initial_window: frame::DEFAULT_WINDOW,
            backend_initial_window: frame::DEFAULT_WINDOW,
            client_max_frame: frame::DEFAULT_MAX_FRAME,
            backend_max_frame: frame::DEFAULT_MAX_FRAME,
            backend_settings: false,
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
        self.c_in.extend_from_slice(data);
        self.client_read();
    }

    /// Takes bytes the runtime sent (as read from its socket).
    pub fn backend_input(&mut self, data: &[u8]) {
        self.b_in.extend_from_slice(data);
        self.backend_read();
    }

    /// Runs what the calls' tasks asked for so far.
    pub fn run_commands(&mut self) {
        while let Ok(command) = self.commands.try_recv() {
            self.on_command(command);
        }
    }

    /// Shutdown: graceful GOAWAY; the connection ends once its calls have ([`Core::finished`]).
    pub fn stop(&mut self) {
        self.stopping = true;
        self.begin_close();
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

    fn client_bytes(&mut self) -> Result<(), Fatal> {
        if !self.preface {
            if self.c_in.len() < frame::PREFACE.len() {
                return if frame::PREFACE.starts_with(&self.c_in) {
                    Ok(())
                } else {
                    Err(Fatal(reason::PROTOCOL_ERROR, "not an HTTP/2 client"))
                };
            }
            if &self.c_in[..frame::PREFACE.len()] != frame::PREFACE {
                return Err(Fatal(reason::PROTOCOL_ERROR, "not an HTTP/2 client"));
            }
            self.c_in.advance(frame::PREFACE.len());
            self.preface = true;
            if self.connected {
                self.to_backend.extend_from_slice(frame::PREFACE);
            } else {
                frame::settings(&mut self.to_client, &[(setting::MAX_CONCURRENT_STREAMS, self.max_streams)]);
            }
        }
        self.frames(Side::Client)
    }

    fn client_frame(&mut self, head: Head, raw: &[u8]) -> Result<(), Fatal> {
        if matches!(head.kind, kind::HEADERS | kind::CONTINUATION) || self.c_block.is_some() {
            return match assemble(&mut self.c_block, head, raw)? {
                Some(block) => self.client_block(block.stream, block.flags, &block.raw, &block.fragment),
                None => Ok(()),
            };
        }
        match head.kind {
            kind::DATA => self.client_data(head, raw),
            kind::SETTINGS => {
                if !head.has(flag::ACK) {
                    for (id, value) in frame::settings_entries(&raw[HEAD_LEN..]) {
                        match id {
                            setting::HEADER_TABLE_SIZE => self.b_hpack.set_allowed(value as usize),
                            setting::INITIAL_WINDOW_SIZE => {
                                let delta = i64::from(value) - self.client_initial_window;
                                self.client_initial_window = i64::from(value);
                                for s in self.streams.values_mut() {
                                    if let StreamKind::TakenOver(t) = &mut s.kind {
                                        t.window += delta;
                                    }
                                }
                            }
                            setting::MAX_FRAME_SIZE => self.client_max_frame = frame_size(value),
                            _ => {}
                        }
                    }
                    if !self.connected {
                        frame::settings_ack(&mut self.to_client);
                        return Ok(());
                    }
                } else if !self.connected {
                    return Ok(());
                }
                self.send_backend(raw);
                self.flush_pending();
                Ok(())
            }
            kind::PING => {
                if head.has(flag::ACK) && raw[HEAD_LEN..] == CLOSING_PING {
                    if self.closing == Closing::Pinged {
                        frame::goaway(&mut self.to_client, self.last_stream, reason::NO_ERROR);
                        self.closing = Closing::Final(self.last_stream);
                    }
                } else if self.connected {
                    self.send_backend(raw);
                } else if !head.has(flag::ACK) && head.len == 8 {
                    let opaque: [u8; 8] = raw[HEAD_LEN..].try_into().expect("8 bytes");
                    frame::ping(&mut self.to_client, true, &opaque);
                }
                Ok(())
            }
            kind::WINDOW_UPDATE => {
                let increment = increment(&head, raw)?;
                if head.stream == 0 {
                    let theirs = self.client_window.granted(increment);
                    if theirs > 0 && self.connected {
                        frame::window_update(&mut self.to_backend, 0, theirs);
                    }
                    self.release_b_held();
                    self.flush_pending();
                } else if let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&head.stream) {
                    t.window += i64::from(increment);
                    self.flush_reply(head.stream);
                } else {
                    self.send_backend(raw);
                }
                Ok(())
            }
            kind::RST_STREAM => {
                let Some(stream) = self.streams.get_mut(&head.stream) else {
                    self.send_backend(raw);
                    return Ok(());
                };
                match &mut stream.kind {
                    StreamKind::Relayed { .. } => {
                        self.send_backend(raw);
                        self.end_stream(head.stream, Status::new(Code::CANCELLED, "client reset the call"));
                    }
                    // The task is told, and records the call itself.
                    StreamKind::Intercepted(i) => {
                        i.task.cancel();
                        self.send_backend(raw);
                        self.streams.remove(&head.stream);
                    }
                    StreamKind::TakenOver(t) => {
                        t.task.cancel();
                        self.streams.remove(&head.stream);
                    }
                }
                Ok(())
            }
            // PRIORITY, GOAWAY, PUSH_PROMISE (a client must not send it: the runtime says so),
            // and frame types this relay does not know (which peers ignore).
            _ => {
                self.send_backend(raw);
                Ok(())
            }
        }
    }

    fn client_data(&mut self, head: Head, raw: &[u8]) -> Result<(), Fatal> {
        let task = match self.streams.get_mut(&head.stream).map(|s| &mut s.kind) {
            Some(StreamKind::Intercepted(i)) => &mut i.task,
            Some(StreamKind::TakenOver(t)) => &mut t.task,
            _ => {
                if !self.connected {
                    if head.len > 0 {
                        frame::window_update(&mut self.to_client, 0, head.len as u32);
                    }
                } else if head.len as i64 > self.backend_window.room {
                    self.c_held = Some((head, BytesMut::from(raw)));
                    self.c_scanned = 0;
                } else {
                    self.backend_window.room -= head.len as i64;
                    self.send_backend(raw);
                }
                return Ok(());
            }
        };
        let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
        // The runtime does not get these bytes as they are: the client gets its connection
        // window back (with the next bytes it is written, or once CREDIT_BATCH is owed), and
        // the stream's at once while the task takes the body (a body it no longer takes stalls
        // in the client, not in the proxy).
        if head.len > 0 {
            self.client_credit += head.len as u32;
            if !head.has(flag::END_STREAM) && task.body.is_some() {
                frame::window_update(&mut self.to_client, head.stream, head.len as u32);
            }
        }
        if let Some(body) = &task.body {
            if range.end > range.start {
                let chunk = Bytes::copy_from_slice(&raw[HEAD_LEN + range.start..HEAD_LEN + range.end]);
                if body.send(Ok(chunk)).is_err() {
                    task.body = None;
                }
            }
        }
        if head.has(flag::END_STREAM) {
            task.body = None;
            task.client_done = true;
            self.remove_if_done(head.stream);
        }
        if self.client_credit >= CREDIT_BATCH {
            self.settle_credit();
        }
        Ok(())
    }

    /// Sends the held client DATA frame once the runtime's window has room, and reads on.
    fn release_c_held(&mut self) {
        if let Some((head, _)) = &self.c_held {
            if head.len as i64 <= self.backend_window.room {
                let (head, raw) = self.c_held.take().expect("checked");
                self.backend_window.room -= head.len as i64;
                self.send_backend(raw.as_ref());
                if let Err(Fatal(code, why)) = self.client_bytes() {
                    self.fatal(code, why);
                }
            }
        }
    }

    /// A whole header block from the client: decoded, forwarded, and a new call routed.
    /// `raw`: the block's frames as they came; `fragment`: the block itself.
    fn client_block(&mut self, id: u32, flags: u8, raw: &[u8], fragment: &[u8]) -> Result<(), Fatal> {
        decode(&mut self.c_hpack, fragment, &mut self.headers)?;
        let end_stream = flags & flag::END_STREAM != 0;
        if id <= self.last_stream || id.is_multiple_of(2) {
            // Trailers of a call the client streams to (or a peer error the runtime reports).
            self.send_backend(raw);
            if end_stream {
                let task = match self.streams.get_mut(&id).map(|s| &mut s.kind) {
                    Some(StreamKind::Intercepted(i)) => {
                        i.upstream_closed = true;
                        Some(&mut i.task)
                    }
                    Some(StreamKind::TakenOver(t)) => Some(&mut t.task),
                    _ => None,
                };
                if let Some(task) = task {
                    task.body = None;
                    task.client_done = true;
                }
                self.remove_if_done(id);
            }
            return Ok(());
        }
        self.last_stream = id;
        // A request without a `:path` (or with one that is not UTF-8) is relayed under an empty
        // method name (metrics label `other`); the runtime answers it as it sees fit.
        let path = Box::<str>::from(String::from_utf8_lossy(self.headers.get(b":path").unwrap_or_default()));
        if let Closing::Final(last) = self.closing {
            if id > last {
                // Refused by the final GOAWAY: the client knows; the runtime must not run it.
                self.send_backend(raw);
                self.reset_at_backend(id);
                return Ok(());
            }
        }
        let start = Instant::now();
        if let Some(gone) = self.gone.clone() {
            // No runtime connection to relay on: the call goes over the shared one, which
            // answers UNAVAILABLE naming the socket while the runtime is down. Once it is back,
            // the client is asked to come back on a new, relayed, connection.
            if self.closing == Closing::Open && !self.probing {
                // Is it back? Dialled by a task (a connect can block), answered as a command.
                self.probing = true;
                self.aux_due = true;
                let (runtime, commands) = (self.runtime.clone(), self.commands_tx.clone());
                self.tasks.spawn(async move {
                    let up = runtime.dial_raw().await.is_ok();
                    let _ = commands.send(Command::Probed { up });
                });
            }
            if self.streams.len() >= self.max_streams as usize {
                frame::rst_stream(&mut self.to_client, id, reason::REFUSED_STREAM);
                return Ok(());
            }
            if crate::cri::newer_cri::is_server_stream(&path) {
                // A stream cannot be taken over whole; the client opens it again on the new
                // connection.
                let status = Status::new(Code::UNAVAILABLE, format!("{path}: {gone}"));
                self.answer_status(id, &status);
                self.router.record(&path, &status, start.elapsed());
                return Ok(());
            }
            let route = self.router.route(&path);
            self.take_over(id, path, route, end_stream, None);
            return Ok(());
        }
        let only_held = self.to_backend.len() == self.held_heads;
        self.send_backend(raw);
        if self.streams.len() >= self.max_streams as usize {
            self.reset_at_backend(id);
            frame::rst_stream(&mut self.to_client, id, reason::REFUSED_STREAM);
            return Ok(());
        }
        let route = self.router.route(&path);
        let deadline = match route {
            Route::Unary => None,
            _ => self.headers.get(b"grpc-timeout").and_then(grpc::parse_timeout_value).map(|d| start + d),
        };
        if let Some(d) = deadline {
            self.arm(d);
        }
        match route {
            Route::Relay => {
                self.streams.insert(id, Stream { method: path, start, head_sent: false, kind: StreamKind::Relayed { deadline } });
            }
            Route::Intercept(_) => {
                // A call with a body: its head waits for it (unless other bytes go anyway).
                if only_held && !end_stream && self.connected {
                    self.held_heads = self.to_backend.len();
                }
                self.take_over(id, path, route, end_stream, Some(deadline));
            }
            Route::Unary => {
                self.reset_at_backend(id);
                self.take_over(id, path, route, end_stream, None);
            }
        }
        Ok(())
    }

    /// Starts the task of an intercepted call that goes on on this stream (`relayed`: `Some`
    /// of its deadline) or of a call taken over (sent over the shared connection).
    fn take_over(&mut self, id: u32, path: Box<str>, route: Route, end_stream: bool, relayed: Option<Option<Instant>>) {
        let start = Instant::now();
        let parts = request_parts(&self.headers, &path, relayed.is_none());
        let (body_tx, body) = mpsc::unbounded_channel();
        let (cancel, cancelled) = oneshot::channel();
        let task = Task { body: (!end_stream).then_some(body_tx), cancel: Some(cancel), client_done: end_stream };
        let kind = if let Some(deadline) = relayed {
            StreamKind::Intercepted(Box::new(Intercepted {
                task,
                outgoing: None,
                window: self.backend_initial_window,
                answer: None,
                sent: false,
                upstream_closed: end_stream,
                head: None,
                data: BytesMut::new(),
                data_cut: false,
                deadline,
                early: BytesMut::new(),
                early_answer: None,
            }))
        } else {
            StreamKind::TakenOver(Box::new(TakenOver { task, window: self.client_initial_window, reply: None, replied: false }))
        };
        self.streams.insert(id, Stream { method: path.clone(), start, head_sent: false, kind });
        let (router, commands) = (self.router.clone(), self.commands_tx.clone());
        let relayed = relayed.is_some();
        self.aux_due = true;
        self.tasks.spawn(Box::pin(async move {
            let method: &str = &path;
            let onward: Onward<'_> =
                if relayed { on_stream(id, commands.clone()) } else { intercept::over_shared(router.backend_for(method), method) };
            let cancelled = async {
                if cancelled.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let outcome = tokio::select! {
                // A client's reset wins over what it caused (the answer channel dropped).
                biased;
                () = cancelled => {
                    router.record(method, &Status::new(Code::CANCELLED, "client reset the call"), start.elapsed());
                    return;
                }
                outcome = call(&router, route, method, onward, parts, body) => outcome,
            };
            let (status, post) = match outcome {
                Ok((answer, post)) => {
                    let status = answer.status();
                    if !relayed {
                        let _ = commands.send(Command::Reply { stream: id, answer: Ok(answer) });
                    }
                    (status, post)
                }
                Err(status) => {
                    let command = if relayed {
                        Command::Fail { stream: id, status: status.clone() }
                    } else {
                        Command::Reply { stream: id, answer: Err(status.clone()) }
                    };
                    let _ = commands.send(command);
                    (status, None)
                }
            };
            if let Some(post) = post {
                post.await;
            }
            router.record(method, &status, start.elapsed());
        }));
    }

    // ===== runtime → client =====

    fn backend_bytes(&mut self) -> Result<(), Fatal> {
        self.frames(Side::Backend)
    }

    /// Handles the whole frames at the front of one side's input, where they lie (no copy per
    /// frame): the input is taken for the loop and given back without what was handled. Stops
    /// at a frame held back for want of window, and when that side can take no more (the
    /// connection over, the runtime connection lost).
    ///
    /// Errors: a frame larger than the receiver's SETTINGS_MAX_FRAME_SIZE, or the frame
    /// handler's.
    fn frames(&mut self, from: Side) -> Result<(), Fatal> {
        let (mut input, max_frame) = match from {
            Side::Client => (std::mem::take(&mut self.c_in), self.backend_max_frame),
            Side::Backend => (std::mem::take(&mut self.b_in), self.client_max_frame.max(frame::DEFAULT_MAX_FRAME)),
        };
        let mut at = 0;
        let result = loop {
            let stopped = match from {
                Side::Client => self.done,
                Side::Backend => !self.connected,
            };
            if stopped || input.len() - at < HEAD_LEN {
                break Ok(());
            }
            if self.held(from) {
                match self.window_updates_ahead(from, &mut input, at) {
                    Ok(()) if self.held(from) => break Ok(()),
                    Ok(()) => continue,
                    Err(e) => break Err(e),
                }
            }
            let head = Head::parse(&input[at..]);
            if head.len > max_frame {
                break Err(Fatal(reason::FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE"));
            }
            let end = at + HEAD_LEN + head.len;
            if input.len() < end {
                input.reserve(end - input.len());
                break Ok(());
            }
            let handled = match from {
                Side::Client => self.client_frame(head, &input[at..end]),
                Side::Backend => self.backend_frame(head, &input[at..end]),
            };
            at = end;
            if handled.is_err() {
                break handled;
            }
        };
        input.advance(at);
        match from {
            Side::Client => self.c_in = input,
            // Once the runtime connection is lost, what it sent is dropped with it.
            Side::Backend if self.connected => self.b_in = input,
            Side::Backend => {}
        }
        result
    }

    /// Whether a DATA frame from `from` waits for the other peer's connection window.
    fn held(&self, from: Side) -> bool {
        match from {
            Side::Client => self.c_held.is_some(),
            Side::Backend => self.b_held.is_some(),
        }
    }

    /// While a frame from `from` is held, the connection-level WINDOW_UPDATEs queued behind it
    /// (in `input`, from `at`) are taken out and applied now. The held frame waits for the
    /// other peer's credit, which may itself wait behind a frame of the other peer's that the
    /// relay holds for *this* peer's credit — a WINDOW_UPDATE in this queue: taken in order,
    /// neither would ever come. A connection-level WINDOW_UPDATE only adds credit for the other
    /// direction, so where it arrives among the sender's other frames does not matter to the
    /// receiver (RFC 9113 §6.9; stream-level ones stay in order, as SETTINGS may change stream
    /// windows). A header block is passed over whole, never taken a frame out of (a frame
    /// inside it is a protocol error, found when the block's turn comes); the look stops at an
    /// incomplete frame or block, or a malformed one, and goes on from there with the next read
    /// (`c_scanned`, `b_scanned`), until the held frame went on or the connection ends.
    fn window_updates_ahead(&mut self, from: Side, input: &mut BytesMut, at: usize) -> Result<(), Fatal> {
        let mut scan = at
            + match from {
                Side::Client => self.c_scanned,
                Side::Backend => self.b_scanned,
            };
        let result = loop {
            let stopped = match from {
                Side::Client => self.done,
                Side::Backend => !self.connected,
            };
            if stopped || !self.held(from) {
                break Ok(());
            }
            let Some((head, end)) = whole_frame(input, scan) else { break Ok(()) };
            if matches!(head.kind, kind::HEADERS | kind::PUSH_PROMISE) && !head.has(flag::END_HEADERS) {
                match block_end(input, end, head.stream) {
                    Some(block_end) => scan = block_end,
                    None => break Ok(()),
                }
                continue;
            }
            if head.kind != kind::WINDOW_UPDATE || head.stream != 0 {
                scan = end;
                continue;
            }
            let mut raw = [0u8; HEAD_LEN + 4];
            let Some(frame) = raw.get_mut(..end - scan) else {
                break Err(Fatal(reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"));
            };
            frame.copy_from_slice(&input[scan..end]);
            let tail = input.split_off(end);
            input.truncate(scan);
            input.unsplit(tail);
            let handled = match from {
                Side::Client => self.client_frame(head, frame),
                Side::Backend => self.backend_frame(head, frame),
            };
            if handled.is_err() {
                break handled;
            }
        };
        match from {
            Side::Client => self.c_scanned = scan - at,
            Side::Backend => self.b_scanned = scan - at,
        }
        result
    }

    fn backend_frame(&mut self, head: Head, raw: &[u8]) -> Result<(), Fatal> {
        if matches!(head.kind, kind::HEADERS | kind::CONTINUATION) || self.b_block.is_some() {
            return match assemble(&mut self.b_block, head, raw)? {
                Some(block) => self.backend_block(block.stream, block.flags, &block.raw, &block.fragment),
                None => Ok(()),
            };
        }
        let on_stream = match self.streams.get_mut(&head.stream) {
            Some(Stream { kind: StreamKind::Relayed { .. }, .. }) => true,
            Some(Stream { kind: StreamKind::Intercepted(i), .. }) if i.sent => true,
            Some(Stream { kind: StreamKind::Intercepted(i), .. }) => {
                // Before the pre stage is done: a reset is held with the rest (see
                // `backend_block`); a message before the request's is not gRPC, and dropped.
                if head.kind == kind::RST_STREAM && i.early_answer.is_none() {
                    i.early.extend_from_slice(raw);
                    i.early_answer = Some(Err(Status::new(Code::UNAVAILABLE, "stream reset by the backend")));
                    return Ok(());
                }
                false
            }
            _ => false,
        };
        match head.kind {
            kind::DATA => {
                if !on_stream {
                    // A stream the relay ended or took over: the runtime gets its window back.
                    if head.len > 0 {
                        frame::window_update(&mut self.to_backend, 0, head.len as u32);
                    }
                    return Ok(());
                }
                if head.len as i64 > self.client_window.room {
                    self.b_held = Some((head, BytesMut::from(raw)));
                    self.b_scanned = 0;
                    return Ok(());
                }
                self.forward_data(head, raw)
            }
            kind::SETTINGS if !head.has(flag::ACK) => {
                let mut entries: Vec<(u16, u32)> = frame::settings_entries(&raw[HEAD_LEN..]).collect();
                let mut capped = false;
                for (id, value) in &mut entries {
                    match *id {
                        setting::HEADER_TABLE_SIZE => self.c_hpack.set_allowed(*value as usize),
                        setting::MAX_FRAME_SIZE => self.backend_max_frame = frame_size(*value),
                        setting::INITIAL_WINDOW_SIZE => {
                            let delta = i64::from(*value) - self.backend_initial_window;
                            self.backend_initial_window = i64::from(*value);
                            for s in self.streams.values_mut() {
                                if let StreamKind::Intercepted(i) = &mut s.kind {
                                    i.window += delta;
                                }
                            }
                        }
                        setting::MAX_CONCURRENT_STREAMS => {
                            *value = (*value).min(self.max_streams);
                            capped = true;
                        }
                        _ => {}
                    }
                }
                if !capped {
                    entries.push((setting::MAX_CONCURRENT_STREAMS, self.max_streams));
                }
                frame::settings(&mut self.to_client, &entries);
                self.backend_settings = true;
                self.flush_pending();
                Ok(())
            }
            kind::WINDOW_UPDATE => {
                let increment = increment(&head, raw)?;
                if head.stream == 0 {
                    let theirs = self.backend_window.granted(increment);
                    if theirs > 0 {
                        frame::window_update(&mut self.to_client, 0, theirs);
                    }
                    self.release_c_held();
                    self.flush_pending();
                } else if let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&head.stream) {
                    i.window += i64::from(increment);
                    self.flush_send(head.stream);
                } else if on_stream {
                    self.to_client.extend_from_slice(raw);
                }
                Ok(())
            }
            kind::PUSH_PROMISE => Err(Fatal(reason::PROTOCOL_ERROR, "PUSH_PROMISE from a gRPC server")),
            // A stream the relay answers itself (taken over, or an early answer held): not the
            // client's business. A reset of a stream already ended (RST_STREAM(NO_ERROR) after
            // the trailers: "stop sending") goes on.
            kind::RST_STREAM | kind::PRIORITY if head.stream != 0 && !on_stream => {
                if head.kind == kind::RST_STREAM && !self.streams.contains_key(&head.stream) {
                    self.to_client.extend_from_slice(raw);
                }
                Ok(())
            }
            kind::GOAWAY if head.len >= 8 => {
                // The runtime is going away: streams above `last` were not processed (the
                // client retries them, it has the GOAWAY); the connection ends once the rest
                // have, and the relay adds no GOAWAY of its own.
                self.to_client.extend_from_slice(raw);
                let last = u32::from_be_bytes([raw[9], raw[10], raw[11], raw[12]]) & 0x7fff_ffff;
                let refused: Vec<u32> = self
                    .streams
                    .range(last.saturating_add(1)..)
                    .filter(|(_, s)| !matches!(s.kind, StreamKind::TakenOver(_)))
                    .map(|(id, _)| *id)
                    .collect();
                for id in refused {
                    if let Some(Stream { kind: StreamKind::Intercepted(mut i), .. }) = self.streams.remove(&id) {
                        i.task.cancel();
                    }
                }
                self.closing = match self.closing {
                    Closing::Final(f) => Closing::Final(f.min(last)),
                    _ => Closing::Final(last),
                };
                Ok(())
            }
            kind::RST_STREAM => {
                self.to_client.extend_from_slice(raw);
                let code = if head.len == 4 { u32::from_be_bytes([raw[9], raw[10], raw[11], raw[12]]) } else { reason::PROTOCOL_ERROR };
                let status = Status::new(Code::UNAVAILABLE, format!("stream reset by the backend: {}", h2::Reason::from(code)));
                if let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&head.stream) {
                    i.answered(Err(status.clone()));
                }
                self.end_stream(head.stream, status);
                Ok(())
            }
            // SETTINGS ACK, PING, GOAWAY, PRIORITY, unknown types.
            _ => {
                self.to_client.extend_from_slice(raw);
                Ok(())
            }
        }
    }

    fn forward_data(&mut self, head: Head, raw: &[u8]) -> Result<(), Fatal> {
        self.client_window.room -= head.len as i64;
        self.to_client.extend_from_slice(raw);
        if let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&head.stream) {
            let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
            if i.data.len() + range.len() <= ANSWER_COPY_LIMIT && !i.data_cut {
                i.data.extend_from_slice(&raw[HEAD_LEN + range.start..HEAD_LEN + range.end]);
            } else {
                // Too long to copy: the interceptor gets no message from it (the client still
                // gets all of it).
                i.data_cut = true;
                i.data.clear();
            }
            if head.has(flag::END_STREAM) {
                // Ended without trailers: the answer's status is the head's, if any.
                let answer = Answer { head: i.head.take().unwrap_or_default(), data: std::mem::take(&mut i.data).freeze(), trailers: None };
                i.answered(Ok(answer));
            }
        }
        if head.has(flag::END_STREAM) {
            self.end_stream(head.stream, Status::new(Code::UNKNOWN, "backend ended the call without a grpc-status"));
        }
        Ok(())
    }

    /// Sends the held runtime DATA frame once the client's window has room, and reads on.
    fn release_b_held(&mut self) {
        if let Some((head, _)) = &self.b_held {
            if head.len as i64 <= self.client_window.room {
                let (head, raw) = self.b_held.take().expect("checked");
                let live = match self.streams.get(&head.stream) {
                    Some(Stream { kind: StreamKind::Relayed { .. }, .. }) => true,
                    Some(Stream { kind: StreamKind::Intercepted(i), .. }) => i.sent,
                    _ => false,
                };
                let result = if live {
                    self.forward_data(head, &raw)
                } else {
                    // The call ended meanwhile (a deadline, a failure): the runtime gets its
                    // window back, the client nothing on a closed stream.
                    if head.len > 0 {
                        frame::window_update(&mut self.to_backend, 0, head.len as u32);
                    }
                    Ok(())
                };
                let result = result.and_then(|()| self.backend_bytes());
                if let Err(Fatal(_, why)) = result {
                    self.backend_lost(format!("protocol error: {why}"));
                }
            }
        }
    }

    /// A whole header block from the runtime: the response head or trailers of a call.
    /// `raw`: the block's frames as they came; `fragment`: the block itself.
    fn backend_block(&mut self, id: u32, flags: u8, raw: &[u8], fragment: &[u8]) -> Result<(), Fatal> {
        let end_stream = flags & flag::END_STREAM != 0;
        if self.b_verbatim {
            if let Some(stream @ Stream { kind: StreamKind::Relayed { .. }, .. }) = self.streams.get_mut(&id) {
                // A relayed call's block goes on as it came, before it is decoded (for the
                // call's status, and to follow the table): that waits until the write is done.
                stream.head_sent = true;
                self.to_client.extend_from_slice(raw);
                let ended = if end_stream { self.streams.remove(&id).map(|s| (s.method, s.start.elapsed())) } else { None };
                let at = self.undecoded_bytes.len();
                self.undecoded_bytes.extend_from_slice(fragment);
                self.undecoded.push((at..self.undecoded_bytes.len(), ended));
                return Ok(());
            }
        }
        self.decode_undecoded()?;
        decode(&mut self.b_hpack, fragment, &mut self.headers)?;
        let Some(stream) = self.streams.get_mut(&id) else {
            // Not forwardable: from now on the client's table is left as it is.
            self.b_verbatim = false;
            return Ok(());
        };
        if let StreamKind::TakenOver(_) = stream.kind {
            self.b_verbatim = false;
            return Ok(());
        }
        if let StreamKind::Intercepted(i) = &mut stream.kind {
            if !i.sent {
                // The runtime answers before the pre stage is done: held, so that the client
                // gets it after the hooks ran, as it would without the relay.
                self.b_verbatim = false;
                let first = i.head.is_none();
                if first {
                    i.head = Some(response_head(&self.headers));
                }
                frame::put_headers(&mut i.early, id, end_stream, &literal_block(&self.headers), self.client_max_frame);
                if end_stream {
                    let head = i.head.take().unwrap_or_default();
                    let trailers = (!first).then(|| fields(&self.headers));
                    i.early_answer = Some(Ok(Answer { head, data: Bytes::new(), trailers }));
                }
                return Ok(());
            }
        }
        let first = !stream.head_sent;
        stream.head_sent = true;
        if let StreamKind::Intercepted(i) = &mut stream.kind {
            if first {
                i.head = Some(response_head(&self.headers));
            }
        }
        if self.b_verbatim {
            self.to_client.extend_from_slice(raw);
        } else {
            frame::put_headers(&mut self.to_client, id, end_stream, &literal_block(&self.headers), self.client_max_frame);
        }
        if end_stream {
            let status = status_of(&self.headers);
            if let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&id) {
                if !first {
                    let trailers = fields(&self.headers);
                    let answer = Answer {
                        head: i.head.take().unwrap_or_default(),
                        data: std::mem::take(&mut i.data).freeze(),
                        trailers: Some(trailers),
                    };
                    i.answered(Ok(answer));
                } else {
                    let answer = Answer { head: i.head.take().unwrap_or_default(), data: Bytes::new(), trailers: None };
                    i.answered(Ok(answer));
                }
            }
            self.end_stream(id, status);
        }
        Ok(())
    }

    // ===== the intercepted call's body, the taken-over call's answer =====

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Send { stream, body, answer } => {
                match (self.connected, self.streams.get_mut(&stream)) {
                    (true, Some(Stream { kind: StreamKind::Intercepted(i), head_sent, .. })) => {
                        i.sent = true;
                        if !i.early.is_empty() {
                            self.to_client.extend_from_slice(&i.early);
                            i.early.clear();
                            *head_sent = true;
                        }
                        if let Some(early) = i.early_answer.take() {
                            // Answered already: the body has nowhere to go.
                            let _ = answer.send(early);
                            self.reset_at_backend(stream);
                            self.streams.remove(&stream);
                            return;
                        }
                        i.outgoing = Some(body);
                        i.answer = Some(answer);
                    }
                    _ => {
                        let why = self.gone.clone().unwrap_or_else(|| "the client's connection closed".into());
                        let _ = answer.send(Err(Status::new(Code::UNAVAILABLE, why)));
                        return;
                    }
                }
                self.flush_send(stream);
            }
            Command::Fail { stream, status } => {
                if let Some(Stream { kind: StreamKind::Intercepted(_), .. }) = self.streams.get(&stream) {
                    self.fail(stream, status);
                }
            }
            Command::Reply { stream, answer } => self.on_reply(stream, answer),
            Command::Probed { up } => {
                self.probing = false;
                if up && self.closing == Closing::Open {
                    tracing::info!(backend = %self.runtime.path().display(), "backend reachable again; asking the client to reconnect");
                    self.begin_close();
                }
            }
        }
    }

    /// Sends as much of an intercepted call's body as the runtime's windows take.
    fn flush_send(&mut self, id: u32) {
        let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&id) else { return };
        if i.upstream_closed {
            i.outgoing = None;
            return;
        }
        let Some(out) = &mut i.outgoing else { return };
        let room = self.backend_window.room.min(i.window).max(0) as usize;
        let n = room.min(out.len());
        if n == 0 && !out.is_empty() {
            return;
        }
        let chunk = out.split_to(n);
        let end = out.is_empty();
        frame::put_data(&mut self.to_backend, id, &chunk, end, self.backend_max_frame);
        self.backend_window.room -= n as i64;
        self.backend_window.debt += n as u64;
        i.window -= n as i64;
        if end {
            i.outgoing = None;
        }
    }

    /// Writes what waits for window room: intercepted calls' bodies to the runtime, taken-over
    /// calls' answers to the client.
    fn flush_pending(&mut self) {
        let waiting: Vec<(u32, bool)> = self
            .streams
            .iter()
            .filter_map(|(id, s)| match &s.kind {
                StreamKind::Intercepted(i) if i.outgoing.is_some() => Some((*id, true)),
                StreamKind::TakenOver(t) if t.reply.is_some() => Some((*id, false)),
                _ => None,
            })
            .collect();
        for (id, body) in waiting {
            if body {
                self.flush_send(id);
            } else {
                self.flush_reply(id);
            }
        }
    }

    fn on_reply(&mut self, id: u32, answer: Result<Answer, Status>) {
        let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&id) else { return };
        t.reply = Some(match answer {
            Ok(answer) => {
                let mut head = BytesMut::with_capacity(128);
                frame::put_status(&mut head, answer.head.status().as_u16());
                put_fields(&mut head, answer.head.headers());
                let trailers = answer.trailers.as_ref().map(|t| {
                    let mut b = BytesMut::with_capacity(64);
                    put_fields(&mut b, t);
                    b
                });
                PendingReply { head: Some(head), data: answer.data, trailers }
            }
            Err(status) => PendingReply { head: Some(trailers_only(&status)), data: Bytes::new(), trailers: None },
        });
        self.flush_reply(id);
    }

    /// Writes as much of a taken-over call's answer as the client's windows take.
    fn flush_reply(&mut self, id: u32) {
        let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&id) else { return };
        let Some(reply) = &mut t.reply else { return };
        if let Some(head) = reply.head.take() {
            let end = reply.data.is_empty() && reply.trailers.is_none();
            frame::put_headers(&mut self.to_client, id, end, &head, self.client_max_frame);
        }
        if !reply.data.is_empty() {
            let room = self.client_window.room.min(t.window).max(0) as usize;
            let n = room.min(reply.data.len());
            if n > 0 {
                let chunk = reply.data.split_to(n);
                let end = reply.data.is_empty() && reply.trailers.is_none();
                frame::put_data(&mut self.to_client, id, &chunk, end, self.client_max_frame);
                self.client_window.room -= n as i64;
                self.client_window.debt += n as u64;
                t.window -= n as i64;
            }
        }
        if reply.data.is_empty() {
            if let Some(trailers) = reply.trailers.take() {
                frame::put_headers(&mut self.to_client, id, true, &trailers, self.client_max_frame);
            }
            t.reply = None;
            t.replied = true;
            if !t.task.client_done {
                // Answered while the client still sends (a task that failed early): it is told
                // to stop (RFC 9113 §8.1), and the stream is forgotten.
                t.task.cancel();
                frame::rst_stream(&mut self.to_client, id, reason::NO_ERROR);
                self.streams.remove(&id);
            }
            self.remove_if_done(id);
        }
    }

    /// Forgets a taken-over stream once answered and the client is done sending.
    fn remove_if_done(&mut self, id: u32) {
        if let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get(&id) {
            if t.replied && t.task.client_done {
                self.streams.remove(&id);
            }
        }
    }

    // ===== the proxy's own answers =====

    /// Ends a call in the relay's books; records it when the relay is the one to (a relayed
    /// call: the other kinds' tasks record theirs).
    fn end_stream(&mut self, id: u32, status: Status) {
        if let Some(stream) = self.streams.remove(&id) {
            if let StreamKind::Relayed { .. } = stream.kind {
                self.ended.push((stream.method, status, stream.start.elapsed()));
            }
        }
    }

    /// Decodes the runtime's header blocks that went on undecoded (in order, before any later
    /// block), and learns the status of the calls they ended.
    ///
    /// Errors: a block that does not decode (the runtime connection cannot go on).
    fn decode_undecoded(&mut self) -> Result<(), Fatal> {
        let mut result = Ok(());
        let (mut blocks, mut bytes) = (std::mem::take(&mut self.undecoded), std::mem::take(&mut self.undecoded_bytes));
        for (range, ended) in blocks.drain(..) {
            let status = match result {
                Ok(()) => match decode(&mut self.b_hpack, &bytes[range], &mut self.headers) {
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

    fn reset_at_backend(&mut self, id: u32) {
        if self.connected {
            frame::rst_stream(&mut self.to_backend, id, reason::CANCEL);
        }
    }

    /// Answers stream `id` with `status`, trailers-only.
    fn answer_status(&mut self, id: u32, status: &Status) {
        frame::put_headers(&mut self.to_client, id, true, &trailers_only(status), self.client_max_frame);
    }

    /// Ends a relayed or intercepted call with `status` from the proxy: trailers after its
    /// head, else trailers-only; the runtime's stream is reset.
    fn fail(&mut self, id: u32, status: Status) {
        let Some(stream) = self.streams.get_mut(&id) else { return };
        if stream.head_sent {
            let mut block = BytesMut::with_capacity(32 + status.message.len());
            put_fields(&mut block, &status.trailers());
            frame::put_headers(&mut self.to_client, id, true, &block, self.client_max_frame);
        } else {
            frame::put_headers(&mut self.to_client, id, true, &trailers_only(&status), self.client_max_frame);
        }
        if let StreamKind::Intercepted(i) = &mut stream.kind {
            i.answered(Err(status.clone()));
        }
        self.reset_at_backend(id);
        self.end_stream(id, status);
    }

    // ===== deadlines, loss, closing =====

    fn arm(&mut self, deadline: Instant) {
        if self.next_deadline.is_some_and(|d| d <= deadline) && self.timer.is_some() {
            return;
        }
        self.next_deadline = Some(deadline);
        self.timer = Some(Box::pin(tokio::time::sleep_until(deadline.into())));
        self.aux_due = true;
    }

    fn expire_deadlines(&mut self) {
        let now = Instant::now();
        self.next_deadline = None;
        let mut expired = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, s) in &self.streams {
            let deadline = match &s.kind {
                StreamKind::Relayed { deadline } => *deadline,
                StreamKind::Intercepted(i) if i.sent => i.deadline,
                _ => None,
            };
            if let (Some(d), false) = (&deadline, s.head_sent) {
                if *d <= now {
                    expired.push((*id, d.saturating_duration_since(s.start)));
                } else {
                    next = Some(next.map_or(*d, |n| n.min(*d)));
                }
            }
        }
        for (id, timeout) in expired {
            let method = self.streams.get(&id).map(|s| s.method.clone()).unwrap_or_default();
            let status =
                Status::new(Code::DEADLINE_EXCEEDED, format!("{method}: deadline of {timeout:?} exceeded waiting for {}", self.runtime));
            self.fail(id, status);
        }
        if let Some(d) = next {
            self.arm(d);
        }
    }

    /// The runtime connection broke (`why`, for the statuses): calls on it end `UNAVAILABLE`,
    /// new ones are taken over (see the module docs).
    pub fn backend_lost(&mut self, why: String) {
        if !self.connected {
            return;
        }
        let _ = self.decode_undecoded();
        self.connected = false;
        tracing::warn!(backend = %self.runtime.path().display(), error = %why, "backend connection broken");
        self.runtime.connection_lost();
        self.to_backend.clear();
        self.held_heads = 0;
        self.b_in.clear();
        self.b_block = None;
        self.b_held = None;
        // The relay is the client's peer from now on: SETTINGS if the runtime's never came, the
        // held DATA's credit back, and the client's connection window as a fresh peer's.
        if !self.backend_settings {
            frame::settings(&mut self.to_client, &[(setting::MAX_CONCURRENT_STREAMS, self.max_streams)]);
        }
        if let Some((head, _)) = self.c_held.take() {
            self.backend_window.room += head.len as i64;
        }
        let client_view = self.backend_window.room + self.backend_window.debt as i64;
        if client_view < frame::DEFAULT_WINDOW {
            frame::window_update(&mut self.to_client, 0, (frame::DEFAULT_WINDOW - client_view) as u32);
        }
        self.backend_window = Window { room: frame::DEFAULT_WINDOW.max(client_view), debt: 0 };
        let on_it: Vec<u32> = self.streams.iter().filter(|(_, s)| !matches!(s.kind, StreamKind::TakenOver(_))).map(|(id, _)| *id).collect();
        for id in on_it {
            let method = self.streams.get(&id).map(|s| s.method.clone()).unwrap_or_default();
            let status = Status::new(Code::UNAVAILABLE, format!("{method}: {} failed the call: {why}", self.runtime));
            self.fail(id, status);
        }
        self.gone = Some(format!("{} failed: {why}", self.runtime));
    }

    /// Graceful GOAWAY, first step (the second when the client acknowledges the PING).
    fn begin_close(&mut self) {
        if self.closing != Closing::Open {
            return;
        }
        frame::goaway(&mut self.to_client, 0x7fff_ffff, reason::NO_ERROR);
        frame::ping(&mut self.to_client, false, &CLOSING_PING);
        self.closing = Closing::Pinged;
    }

    fn fatal(&mut self, code: u32, why: &'static str) {
        tracing::debug!(error = why, "client connection error; closing it");
        frame::goaway(&mut self.to_client, self.last_stream, code);
        self.closing = Closing::Final(self.last_stream);
        self.done = true;
    }

    fn client_gone(&mut self) {
        self.done = true;
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(stream) = self.streams.get_mut(&id) {
                match &mut stream.kind {
                    StreamKind::Relayed { .. } => self.end_stream(id, Status::new(Code::CANCELLED, "client went away")),
                    StreamKind::Intercepted(i) => i.task.cancel(),
                    StreamKind::TakenOver(t) => t.task.cancel(),
                }
            }
        }
        self.streams.clear();
    }

    /// After the connection (whose last turn wrote what it could): calls still open are
    /// recorded as cancelled, their tasks told.
    pub fn finish(&mut self) {
        self.client_gone();
        self.after_write();
    }

    /// Queues `raw` for the runtime, if there is a runtime connection.
    fn send_backend(&mut self, raw: &[u8]) {
        if self.connected {
            self.to_backend.extend_from_slice(raw);
        }
    }
}

impl Task {
    /// Tells the task the client reset the call (or went away).
    fn cancel(&mut self) {
        self.body = None;
        if let Some(c) = self.cancel.take() {
            let _ = c.send(());
        }
    }
}

impl Intercepted {
    /// Hands the answer to the task, if it waits for one.
    fn answered(&mut self, answer: Result<Answer, Status>) {
        if let Some(tx) = self.answer.take() {
            let _ = tx.send(answer);
        }
    }
}

/// Onward for an intercepted call: the body goes back to the relay, to be sent on `stream`;
/// the answer comes from it (which also enforces the deadline, as for relayed calls, so that
/// the task and the client learn the same outcome).
fn on_stream<'a>(stream: u32, commands: mpsc::UnboundedSender<Command>) -> Onward<'a> {
    Box::new(move |_head, body, _deadline| {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            let gone = || Status::new(Code::UNAVAILABLE, "the client's connection closed");
            commands.send(Command::Send { stream, body, answer: tx }).map_err(|_| gone())?;
            rx.await.unwrap_or_else(|_| Err(gone()))
        })
    })
}

/// The call of an intercepted or taken-over stream: the interceptor's, or one unary call.
async fn call<'a>(
    router: &'a Router,
    route: Route,
    method: &'a str,
    onward: Onward<'a>,
    parts: Option<http::request::Parts>,
    body: RequestBody,
) -> Result<(Answer, Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>), Status> {
    let parts = parts.ok_or_else(|| Status::new(Code::INTERNAL, format!("{method}: not a valid request head")))?;
    match (route, router.interceptor()) {
        (Route::Intercept(spec), Some(interceptor)) => {
            let (answer, post) = interceptor.intercept(spec, method, onward, parts, body).await?;
            Ok((answer, post.map(|p| Box::pin(p) as Pin<Box<dyn Future<Output = ()> + Send + 'a>>)))
        }
        _ => {
            let limits = router.interceptor().map(|i| i.hooks.limits.clone()).unwrap_or_default();
            let deadline = grpc::parse_timeout(&parts.headers).map(|d| Instant::now() + d);
            let body = intercept::read_body(body, method, &limits).await?;
            Ok((onward(parts, body, deadline).await?, None))
        }
    }
}

/// One side's header block assembly (RFC 9113 §4.3): a HEADERS frame starts a block, whole at
/// once when it has END_HEADERS, and CONTINUATION frames of the same stream add to it until
/// one has. Returns the block once whole: the frames as they came (`raw`, borrowed when the
/// block is one frame) and the block itself (`fragment`, without padding and priority fields).
///
/// Errors: any other frame while a block is open (the block is interrupted), a CONTINUATION
/// without a block, padding or priority fields that do not fit the frame, a block over
/// [`MAX_HEADER_LIST_SIZE`].
fn assemble<'a>(pending: &mut Option<PendingHeaderBlock>, head: Head, raw: &'a [u8]) -> Result<Option<HeaderBlock<'a>>, Fatal> {
    let Some(block) = pending else {
        if head.kind != kind::HEADERS {
            return Err(Fatal(reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS"));
        }
        let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
        let fragment = &raw[HEAD_LEN + range.start..HEAD_LEN + range.end];
        if head.has(flag::END_HEADERS) {
            return Ok(Some(HeaderBlock { stream: head.stream, flags: head.flags, raw: Cow::Borrowed(raw), fragment: Cow::Borrowed(fragment) }));
        }
        *pending = Some(PendingHeaderBlock { stream: head.stream, flags: head.flags, raw: raw.to_vec(), fragment: fragment.to_vec() });
        return Ok(None);
    };
    if head.kind != kind::CONTINUATION || head.stream != block.stream {
        return Err(Fatal(reason::PROTOCOL_ERROR, "header block interrupted"));
    }
    block.fragment.extend_from_slice(&raw[HEAD_LEN..]);
    block.raw.extend_from_slice(raw);
    if block.fragment.len() > MAX_HEADER_LIST_SIZE as usize {
        return Err(Fatal(reason::PROTOCOL_ERROR, "header block too large"));
    }
    if !head.has(flag::END_HEADERS) {
        return Ok(None);
    }
    let PendingHeaderBlock { stream, flags, raw, fragment } = pending.take().expect("checked above");
    Ok(Some(HeaderBlock { stream, flags, raw: Cow::Owned(raw), fragment: Cow::Owned(fragment) }))
}

/// The frame at `at` in `input`, and where it ends, when it is there whole.
fn whole_frame(input: &[u8], at: usize) -> Option<(Head, usize)> {
    if input.len() - at < HEAD_LEN {
        return None;
    }
    let head = Head::parse(&input[at..]);
    let end = at + HEAD_LEN + head.len;
    (input.len() >= end).then_some((head, end))
}

/// Where the header block of `stream` whose first frame ends at `at` ends: after the
/// CONTINUATION with END_HEADERS; `None` while it is incomplete, or when another frame
/// interrupts it.
fn block_end(input: &[u8], mut at: usize, stream: u32) -> Option<usize> {
    loop {
        let (head, end) = whole_frame(input, at)?;
        if head.kind != kind::CONTINUATION || head.stream != stream {
            return None;
        }
        if head.has(flag::END_HEADERS) {
            return Some(end);
        }
        at = end;
    }
}

/// Decodes one header block into `out`.
///
/// Errors (the connection cannot go on either way: the HPACK state is lost): PROTOCOL_ERROR for
/// a block of more than `MAX_FIELDS` fields or of more bytes than said below, COMPRESSION_ERROR
/// for one that does not decode.
fn decode(hpack: &mut hpack::Decoder, fragment: &[u8], out: &mut Fields) -> Result<(), Fatal> {
    // Indexed fields are copied out of the table, so a small block could stand for up to
    // MAX_HEADER_LIST_SIZE bytes of copies: a block may decode to 64 KiB, plus 64 times its own
    // size (a field from the static table is about 40 bytes per byte; gRPC calls need far less).
    let max_size = (MAX_HEADER_LIST_SIZE as usize).min((64 << 10) + 64 * fragment.len());
    hpack.decode(fragment, out, MAX_FIELDS, max_size).map_err(|e| match e {
        hpack::Error::TooLarge => Fatal(reason::PROTOCOL_ERROR, "header list too large"),
        _ => Fatal(reason::COMPRESSION_ERROR, "cannot decode a header block"),
    })
}

/// A SETTINGS_MAX_FRAME_SIZE value within what RFC 9113 allows (16 KiB to 16 MiB − 1; a peer
/// that sends another breaks the protocol, and is read as the nearest bound).
fn frame_size(value: u32) -> usize {
    value.clamp(frame::DEFAULT_MAX_FRAME as u32, (1 << 24) - 1) as usize
}

/// A WINDOW_UPDATE's increment.
///
/// Errors: FRAME_SIZE_ERROR for a payload that is not 4 bytes.
fn increment(head: &Head, raw: &[u8]) -> Result<u32, Fatal> {
    if head.len != 4 {
        return Err(Fatal(reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"));
    }
    Ok(u32::from_be_bytes([raw[9], raw[10], raw[11], raw[12]]) & 0x7fff_ffff)
}

/// The request head of a call the relay hands to a task, from its decoded header block; `None`
/// when the path is not a valid URI path. `all`: with every field (a call sent on over the
/// shared connection); else with the `grpc-` fields only (`grpc-timeout`, `grpc-encoding`: what
/// the interceptor reads of a call that goes on on its stream, whose header block the runtime
/// got as it came). Fields that are not valid HTTP headers are left out.
fn request_parts(headers: &Fields, path: &str, all: bool) -> Option<http::request::Parts> {
    let uri = router::default_uri(headers.get(b":authority"), path)?;
    let (mut parts, ()) = Request::builder().method(Method::POST).uri(uri).body(()).ok()?.into_parts();
    parts.headers = fields_where(headers, |name| all || name.starts_with(b"grpc-"));
    Some(parts)
}

/// A response head from a decoded header block.
fn response_head(headers: &Fields) -> Response<()> {
    let mut head = Response::new(());
    if let Some(status) = headers.get(b":status").and_then(|s| http::StatusCode::from_bytes(s).ok()) {
        *head.status_mut() = status;
    }
    *head.headers_mut() = fields(headers);
    head
}

/// A decoded header block encoded again literally ([`frame::put_literal`]), pseudo-header
/// fields other than `:status` left out.
fn literal_block(headers: &Fields) -> BytesMut {
    let mut out = BytesMut::with_capacity(128);
    for (name, value) in headers.iter() {
        if name == b":status" || !name.starts_with(b":") {
            frame::put_literal(&mut out, name, value);
        }
    }
    out
}

/// The regular fields of a decoded header block that are valid HTTP headers.
fn fields(headers: &Fields) -> HeaderMap {
    fields_where(headers, |_| true)
}

/// The regular fields of a decoded header block that are valid HTTP headers and whose name
/// `keep` accepts.
fn fields_where(headers: &Fields, keep: impl Fn(&[u8]) -> bool) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers.iter().filter(|(name, _)| keep(name)) {
        if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name), http::HeaderValue::from_bytes(value)) {
            map.append(name, value);
        }
    }
    map
}

/// The status a block of trailers (or a trailers-only head) carries; `UNKNOWN` without one.
fn status_of(headers: &Fields) -> Status {
    let code = headers.get(b"grpc-status").and_then(|v| std::str::from_utf8(v).ok()?.parse::<u16>().ok());
    match code {
        Some(c) => Status::new(Code(c), std::str::from_utf8(headers.get(b"grpc-message").unwrap_or_default()).unwrap_or("")),
        None => Status::new(Code::UNKNOWN, "backend ended the call without a grpc-status"),
    }
}

/// A trailers-only answer's header block: `:status 200`, `content-type`, the status fields.
fn trailers_only(status: &Status) -> BytesMut {
    let mut block = BytesMut::with_capacity(64 + status.message.len());
    frame::put_status(&mut block, 200);
    frame::put_literal(&mut block, b"content-type", b"application/grpc");
    put_fields(&mut block, &status.trailers());
    block
}

fn put_fields(out: &mut BytesMut, headers: &HeaderMap) {
    for (name, value) in headers {
        frame::put_literal(out, name.as_str().as_bytes(), value.as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::metrics::Metrics;

    fn core() -> Core {
        let runtime = Arc::new(Backend::new("/nonexistent/runtime-proxy-test.sock"));
        let router = Arc::new(Router::new(runtime.clone(), runtime, None, Arc::new(Metrics::new())));
        Core::new(router, TaskTracker::new(), 100, true, None)
    }

    /// The heads of the whole frames in `buf`.
    fn heads(buf: &[u8]) -> Vec<Head> {
        let (mut at, mut out) = (0, Vec::new());
        while let Some((head, end)) = whole_frame(buf, at) {
            out.push(head);
            at = end;
        }
        out
    }

    /// The payload lengths of the DATA frames of `stream` in `buf`.
    fn data_frames(buf: &[u8], stream: u32) -> Vec<usize> {
        heads(buf).into_iter().filter(|h| h.kind == kind::DATA && h.stream == stream).map(|h| h.len).collect()
    }

    /// A connection with a call on stream 1 (the `:path` block returned) whose next DATA frame
    /// from each peer is held: both connection windows used up by bytes of the relay's own (an
    /// edited request, a taken-over answer).
    fn held_both_ways() -> (Core, BytesMut) {
        let mut core = core();
        let mut client = BytesMut::from(&PREFACE_AND_SETTINGS[..]);
        let mut block = BytesMut::new();
        frame::put_literal(&mut block, b":path", b"/runtime.v1.RuntimeService/Version");
        frame::put_headers(&mut client, 1, false, &block, frame::DEFAULT_MAX_FRAME);
        core.client_input(&client);
        let mut backend = BytesMut::new();
        frame::settings(&mut backend, &[]);
        frame::put_headers(&mut backend, 1, false, &[0x88], frame::DEFAULT_MAX_FRAME);
        core.backend_input(&backend);
        core.backend_window.room = 0;
        core.client_window.room = 0;
        let (mut client, mut backend) = (BytesMut::new(), BytesMut::new());
        frame::put_data(&mut client, 1, &Bytes::from_static(&[1; 10]), true, frame::DEFAULT_MAX_FRAME);
        frame::put_data(&mut backend, 1, &Bytes::from_static(&[2; 20]), false, frame::DEFAULT_MAX_FRAME);
        core.client_input(&client);
        core.backend_input(&backend);
        assert!(core.c_held.is_some() && core.b_held.is_some());
        core.to_client.clear();
        core.to_backend.clear();
        (core, block)
    }

    #[test]
    fn frames_held_both_ways_are_released_by_window_updates_queued_behind_them() {
        let (mut core, block) = held_both_ways();
        // Each peer's credit comes behind more of its own frames: a PING (and, from the client,
        // a new call whose header block spans three frames), then WINDOW_UPDATE; it comes in
        // two reads.
        let (mut client, mut backend) = (BytesMut::new(), BytesMut::new());
        frame::ping(&mut client, false, b"clientpi");
        frame::put_headers(&mut client, 3, true, &block, 16);
        core.client_input(&client);
        assert!(core.to_client.is_empty(), "nothing went on yet");
        client.clear();
        frame::window_update(&mut client, 0, 100);
        frame::ping(&mut backend, false, b"runtimep");
        frame::window_update(&mut backend, 0, 100);
        core.client_input(&client);
        assert_eq!(data_frames(&core.to_client, 1), vec![20], "the runtime's DATA went on with the client's credit");
        core.backend_input(&backend);
        assert_eq!(data_frames(&core.to_backend, 1), vec![10], "the client's DATA went on with the runtime's credit");
        assert!(core.c_held.is_none() && core.b_held.is_none());
        // What came behind the held frames still went on, in order: the PINGs after the DATA.
        let pings = |buf: &[u8]| heads(buf).iter().filter(|h| h.kind == kind::PING).count();
        assert_eq!((pings(&core.to_backend), pings(&core.to_client)), (1, 1));
        assert!(core.streams.contains_key(&3), "the call behind the held frame was taken up");
    }

    #[test]
    fn a_window_update_inside_an_open_header_block_is_not_taken_out() {
        let (mut core, block) = held_both_ways();
        // HEADERS without END_HEADERS, the WINDOW_UPDATE, then the CONTINUATION: a protocol
        // error once the block's turn comes, not credit to take early.
        let mut split = BytesMut::new();
        frame::put_headers(&mut split, 3, true, &block, 16);
        let first = HEAD_LEN + Head::parse(&split).len;
        let mut client = BytesMut::from(&split[..first]);
        frame::window_update(&mut client, 0, 100);
        client.extend_from_slice(&split[first..]);
        core.client_input(&client);
        assert!(core.b_held.is_some(), "the runtime's DATA still waits");
        assert_eq!(core.client_window.room, 0);
    }

    /// Connection credit for bodies the relay takes (here: calls taken over, ImageService on a
    /// socket of its own) goes to the client with the next bytes it is written, or once
    /// [`CREDIT_BATCH`] is owed, not in a write of its own per call.
    #[tokio::test]
    async fn credit_for_taken_bodies_waits_for_the_next_write_or_a_batch() {
        let runtime = Arc::new(Backend::new("/nonexistent/runtime-proxy-test.sock"));
        let image = Arc::new(Backend::new("/nonexistent/runtime-proxy-test-images.sock"));
        let router = Arc::new(Router::new(runtime, image, None, Arc::new(Metrics::new())));
        let mut core = Core::new(router, TaskTracker::new(), 100, true, None);
        core.client_input(&PREFACE_AND_SETTINGS);
        core.to_client.clear();
        let mut block = BytesMut::new();
        frame::put_literal(&mut block, b":path", b"/runtime.v1.ImageService/ListImages");
        let credit = |buf: &[u8]| -> Vec<u32> {
            let (mut at, mut out) = (0, Vec::new());
            while let Some((head, end)) = whole_frame(buf, at) {
                if head.kind == kind::WINDOW_UPDATE && head.stream == 0 {
                    out.push(increment(&head, &buf[at..end]).unwrap_or(0));
                }
                at = end;
            }
            out
        };
        let call = |core: &mut Core, id: u32| {
            let mut client = BytesMut::new();
            frame::put_headers(&mut client, id, false, &block, frame::DEFAULT_MAX_FRAME);
            frame::put_data(&mut client, id, &Bytes::from(vec![0; 1000]), true, frame::DEFAULT_MAX_FRAME);
            core.client_input(&client);
        };
        call(&mut core, 1);
        assert_eq!(credit(&core.to_client), Vec::<u32>::new(), "owed, not written alone");
        core.settle_credit();
        assert_eq!(credit(&core.to_client), vec![1000], "settled with the next write");
        core.to_client.clear();
        let mut id = 3;
        while credit(&core.to_client).is_empty() {
            call(&mut core, id);
            id += 2;
        }
        let calls = (id - 3) / 2;
        assert_eq!(credit(&core.to_client), vec![calls * 1000], "written once a batch is owed");
        assert_eq!(calls, CREDIT_BATCH.div_ceil(1000));
    }

    const PREFACE_AND_SETTINGS: [u8; 33] = {
        let mut b = [0u8; 33];
        let mut i = 0;
        while i < 24 {
            b[i] = frame::PREFACE[i];
            i += 1;
        }
        b[27] = kind::SETTINGS;
        b
    };
}
