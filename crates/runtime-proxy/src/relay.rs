//! The CRI front end: each client connection is relayed, frame by frame, over a runtime
//! connection of its own, and the calls the proxy must see are taken over.
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
//! **Taken-over calls** ([`Route::Intercept`], [`Route::Unary`]): the header block goes on
//! (to keep HPACK in step) and the runtime's stream is reset (CANCEL) at once; the body is
//! handed to a task of its own (the interceptor, or one unary call over the shared [`Backend`]
//! connection) and its answer is written back here. Header blocks the relay writes are
//! literal, never indexed ([`frame::put_literal`]), so they fit anywhere in the connection. Once
//! the runtime sends a block the relay cannot forward (an answer on a stream it took over), all
//! later blocks to the client are written that way too. The answer's DATA takes room in the
//! client's window that the runtime does not know about: the relay keeps that count and holds
//! back the client's connection-level WINDOW_UPDATE credit for it (and, meanwhile, any runtime
//! DATA the client has no room for).
//!
//! **Statuses of the proxy's own**: a relayed call still waiting for its response head when its
//! `grpc-timeout` passes is answered `DEADLINE_EXCEEDED` and reset at the runtime; when the
//! runtime's connection breaks, every relayed call in flight ends `UNAVAILABLE` naming the
//! socket (as trailers once its head went out), and the connection goes on serving new calls
//! by taking each over ([`Route::Unary`]: `UNAVAILABLE` naming the socket while the runtime is
//! down) — the relay is then the client's HTTP/2 peer (SETTINGS and PING acknowledged) — and
//! once a call finds the runtime reachable again, it sends GOAWAY the graceful way (GOAWAY,
//! PING, then the final GOAWAY once acknowledged) so the client comes back on a new
//! connection, relayed again. A client connection accepted while the runtime is down starts in
//! that state. GetContainerEvents, a server stream, is answered `UNAVAILABLE` meanwhile.
//!
//! **Shutdown** (`stop`): graceful GOAWAY, then the connection ends once its calls have.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::io::Cursor;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use h2::hpack::{Decoder, Header};
use http::{HeaderMap, Method, Request};
use tokio::io::AsyncWrite;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Sleep;
use tokio_util::task::TaskTracker;

use crate::backend::{Backend, MAX_HEADER_LIST_SIZE};
use crate::frame::{self, flag, kind, reason, setting, Head, HEAD_LEN};
use crate::grpc::{self, Code, Status};
use crate::intercept::{self, RequestBody};
use crate::router::{self, Route, Router};
use crate::uds::Socket;
use crate::unary::{self, Answer};

/// Bytes waiting to be written to one side above which the relay stops reading the other.
const HIGH_WATER: usize = 1 << 20;

/// The opaque data of the PING the relay sends between its two GOAWAY frames.
const CLOSING_PING: [u8; 8] = *b"rp-close";

/// Serves one client connection until it ends (see the module docs). `max_streams`: most calls
/// at once on it (`--max-concurrent-streams`); `stop` turns true at shutdown; taken-over calls
/// run as tasks of `tasks`.
pub async fn serve_connection(client: UnixStream, router: Arc<Router>, tasks: TaskTracker, stop: watch::Receiver<bool>, max_streams: u32) {
    let client = match Socket::new(client) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register client connection");
            return;
        }
    };
    let runtime = router.runtime().clone();
    let (backend, gone) = match runtime.dial_raw().await.and_then(|s| Socket::new(s).map_err(|e| unavailable(&runtime, &e))) {
        Ok(s) => (Some(s), None),
        Err(status) => (None, Some(status.message)),
    };
    let (replies_tx, replies) = mpsc::unbounded_channel();
    let mut stop = stop;
    let stopped: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    });
    let mut relay = Relay {
        router,
        runtime,
        tasks,
        max_streams,
        client,
        backend,
        gone,
        c_in: BytesMut::with_capacity(16 << 10),
        b_in: BytesMut::with_capacity(16 << 10),
        to_client: BytesMut::with_capacity(16 << 10),
        to_backend: BytesMut::with_capacity(16 << 10),
        preface: false,
        c_hpack: Decoder::new(4096),
        b_hpack: Decoder::new(4096),
        headers: Vec::new(),
        b_verbatim: true,
        c_block: None,
        b_block: None,
        b_held: None,
        streams: HashMap::new(),
        last_stream: 0,
        client_window: frame::DEFAULT_WINDOW,
        client_initial_window: frame::DEFAULT_WINDOW,
        client_max_frame: frame::DEFAULT_MAX_FRAME,
        backend_max_frame: frame::DEFAULT_MAX_FRAME,
        debt: 0,
        replies_tx,
        replies,
        timer: None,
        next_deadline: None,
        stopped,
        stopping: false,
        closing: Closing::Open,
        done: false,
    };
    poll_fn(|cx| relay.poll_run(cx)).await;
    relay.finish();
}

fn unavailable(backend: &Backend, e: &dyn std::fmt::Display) -> Status {
    Status::new(Code::UNAVAILABLE, format!("{backend}: cannot connect: {e}"))
}

/// The answer of a taken-over call, from its task.
struct Reply {
    stream: u32,
    answer: Result<Answer, Status>,
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

/// A header block being collected (HEADERS, then CONTINUATION until END_HEADERS).
struct Block {
    stream: u32,
    /// The HEADERS frame's flags (END_STREAM).
    flags: u8,
    /// The frames as they came, to forward verbatim.
    raw: BytesMut,
    /// The block itself (fragments without padding and priority), to decode.
    fragment: BytesMut,
}

/// One call in flight.
struct Stream {
    method: Box<str>,
    start: Instant,
    kind: StreamKind,
}

enum StreamKind {
    Relayed {
        /// The caller's deadline (`grpc-timeout`), enforced until the response head.
        deadline: Option<Instant>,
        /// The response head went to the client.
        head_sent: bool,
    },
    TakenOver(TakenOver),
}

struct TakenOver {
    /// Where the body goes; `None` once it ended (or was refused).
    body: Option<mpsc::UnboundedSender<Result<Bytes, Status>>>,
    /// Bytes of body received.
    received: usize,
    /// Dropped to cancel the task (the client reset the call).
    _cancel: oneshot::Sender<()>,
    /// The client sent END_STREAM.
    client_done: bool,
    /// Room in the client's window for this stream's DATA.
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

struct Relay {
    router: Arc<Router>,
    runtime: Arc<Backend>,
    tasks: TaskTracker,
    max_streams: u32,
    client: Socket,
    /// The runtime connection; `None` once it broke or when it could not be dialled.
    backend: Option<Socket>,
    /// Why there is no runtime connection (for the statuses of calls answered meanwhile).
    gone: Option<String>,
    c_in: BytesMut,
    b_in: BytesMut,
    to_client: BytesMut,
    to_backend: BytesMut,
    /// The client's preface was read.
    preface: bool,
    /// Decodes the client's header blocks (its encoder's table, as the runtime's decoder has it).
    c_hpack: Decoder,
    /// Decodes the runtime's header blocks.
    b_hpack: Decoder,
    /// The last decoded block (reused).
    headers: Vec<Header>,
    /// The runtime's header blocks still go to the client as they came.
    b_verbatim: bool,
    c_block: Option<Block>,
    b_block: Option<Block>,
    /// A runtime DATA frame waiting for room in the client's connection window.
    b_held: Option<(Head, BytesMut)>,
    streams: HashMap<u32, Stream>,
    /// The highest stream the client opened.
    last_stream: u32,
    /// Room in the client's connection window (what it granted minus what it was sent).
    client_window: i64,
    client_initial_window: i64,
    client_max_frame: usize,
    backend_max_frame: usize,
    /// DATA bytes the relay wrote of its own whose credit it has not yet held back from the
    /// client's WINDOW_UPDATEs to the runtime.
    debt: u64,
    replies_tx: mpsc::UnboundedSender<Reply>,
    replies: mpsc::UnboundedReceiver<Reply>,
    timer: Option<Pin<Box<Sleep>>>,
    next_deadline: Option<Instant>,
    stopped: Pin<Box<dyn Future<Output = ()> + Send>>,
    stopping: bool,
    closing: Closing,
    /// The connection is over (the client went away, or a connection error).
    done: bool,
}

/// A connection error: GOAWAY with `reason` to the client, then the connection ends.
struct Fatal(u32, &'static str);

impl Relay {
    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let mut busy = false;
            self.flush(cx);
            if self.done {
                return Poll::Ready(());
            }
            if self.to_backend.len() < HIGH_WATER {
                match read(&mut self.client, &mut self.c_in, cx) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        self.client_gone();
                        return Poll::Ready(());
                    }
                    Poll::Ready(Ok(_)) => {
                        busy = true;
                        if let Err(Fatal(code, why)) = self.client_bytes() {
                            self.fatal(code, why);
                        }
                    }
                    Poll::Pending => {}
                }
            }
            if self.b_held.is_none() && self.to_client.len() < HIGH_WATER {
                if let Some(backend) = &mut self.backend {
                    match read(backend, &mut self.b_in, cx) {
                        Poll::Ready(Ok(0)) => {
                            busy = true;
                            self.backend_lost("the connection was closed".into());
                        }
                        Poll::Ready(Err(e)) => {
                            busy = true;
                            self.backend_lost(e.to_string());
                        }
                        Poll::Ready(Ok(_)) => {
                            busy = true;
                            if let Err(Fatal(code, why)) = self.backend_bytes() {
                                self.backend_lost(format!("protocol error: {why}"));
                                let _ = code;
                            }
                        }
                        Poll::Pending => {}
                    }
                }
            }
            while let Poll::Ready(Some(reply)) = self.replies.poll_recv(cx) {
                busy = true;
                self.on_reply(reply);
            }
            if let Some(timer) = &mut self.timer {
                if timer.as_mut().poll(cx).is_ready() {
                    busy = true;
                    self.timer = None;
                    self.expire_deadlines();
                }
            }
            if !self.stopping && self.stopped.as_mut().poll(cx).is_ready() {
                busy = true;
                self.stopping = true;
                self.begin_close();
            }
            if self.closing != Closing::Open
                && self.streams.is_empty()
                && self.to_client.is_empty()
                && matches!(self.closing, Closing::Final(_))
            {
                self.done = true;
            }
            if !busy && !self.done {
                self.flush(cx);
                if !self.done {
                    return Poll::Pending;
                }
            }
        }
    }

    /// Writes what is waiting for either side, as far as the sockets take it.
    fn flush(&mut self, cx: &mut Context<'_>) {
        if !self.to_client.is_empty() && write(&mut self.client, &mut self.to_client, cx).is_err() {
            self.client_gone();
        }
        if let Some(backend) = &mut self.backend {
            if !self.to_backend.is_empty() {
                if let Err(e) = write(backend, &mut self.to_backend, cx) {
                    self.backend_lost(e.to_string());
                }
            }
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
            if self.backend.is_some() {
                self.to_backend.extend_from_slice(frame::PREFACE);
            } else {
                frame::settings(&mut self.to_client, &[(setting::MAX_CONCURRENT_STREAMS, self.max_streams)]);
            }
        }
        while self.c_in.len() >= HEAD_LEN {
            let head = Head::parse(&self.c_in);
            if head.len > self.backend_max_frame {
                return Err(Fatal(reason::FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE"));
            }
            if self.c_in.len() < HEAD_LEN + head.len {
                self.c_in.reserve(HEAD_LEN + head.len - self.c_in.len());
                break;
            }
            let raw = self.c_in.split_to(HEAD_LEN + head.len);
            self.client_frame(head, raw)?;
            if self.done {
                break;
            }
        }
        Ok(())
    }

    fn client_frame(&mut self, head: Head, raw: BytesMut) -> Result<(), Fatal> {
        if head.kind == kind::CONTINUATION || self.c_block.is_some() {
            let Some(block) = &mut self.c_block else { return Err(Fatal(reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS")) };
            if head.kind != kind::CONTINUATION || head.stream != block.stream {
                return Err(Fatal(reason::PROTOCOL_ERROR, "header block interrupted"));
            }
            block.fragment.extend_from_slice(&raw[HEAD_LEN..]);
            block.raw.extend_from_slice(&raw);
            if block.fragment.len() > MAX_HEADER_LIST_SIZE as usize {
                return Err(Fatal(reason::PROTOCOL_ERROR, "header block too large"));
            }
            if head.has(flag::END_HEADERS) {
                let block = self.c_block.take().expect("checked above");
                return self.client_block(block);
            }
            return Ok(());
        }
        match head.kind {
            kind::DATA => self.client_data(head, raw),
            kind::HEADERS => {
                let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
                let fragment = BytesMut::from(&raw[HEAD_LEN + range.start..HEAD_LEN + range.end]);
                let block = Block { stream: head.stream, flags: head.flags, raw, fragment };
                if head.has(flag::END_HEADERS) {
                    self.client_block(block)
                } else {
                    self.c_block = Some(block);
                    Ok(())
                }
            }
            kind::SETTINGS => {
                if !head.has(flag::ACK) {
                    for (id, value) in frame::settings_entries(&raw[HEAD_LEN..]) {
                        match id {
                            setting::HEADER_TABLE_SIZE => self.b_hpack.queue_size_update(value as usize),
                            setting::INITIAL_WINDOW_SIZE => {
                                let delta = i64::from(value) - self.client_initial_window;
                                self.client_initial_window = i64::from(value);
                                for s in self.streams.values_mut() {
                                    if let StreamKind::TakenOver(t) = &mut s.kind {
                                        t.window += delta;
                                    }
                                }
                            }
                            setting::MAX_FRAME_SIZE => self.client_max_frame = value as usize,
                            _ => {}
                        }
                    }
                    if self.backend.is_none() {
                        frame::settings_ack(&mut self.to_client);
                        return Ok(());
                    }
                } else if self.backend.is_none() {
                    return Ok(());
                }
                self.send_backend(&raw);
                self.flush_replies();
                Ok(())
            }
            kind::PING => {
                if head.has(flag::ACK) && raw[HEAD_LEN..] == CLOSING_PING {
                    if self.closing == Closing::Pinged {
                        frame::goaway(&mut self.to_client, self.last_stream, reason::NO_ERROR);
                        self.closing = Closing::Final(self.last_stream);
                    }
                } else if self.backend.is_some() {
                    self.send_backend(&raw);
                } else if !head.has(flag::ACK) && head.len == 8 {
                    let opaque: [u8; 8] = raw[HEAD_LEN..].try_into().expect("8 bytes");
                    frame::ping(&mut self.to_client, true, &opaque);
                }
                Ok(())
            }
            kind::WINDOW_UPDATE => {
                if head.len != 4 {
                    return Err(Fatal(reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"));
                }
                let increment = u32::from_be_bytes([raw[9], raw[10], raw[11], raw[12]]) & 0x7fff_ffff;
                if head.stream == 0 {
                    self.client_window += i64::from(increment);
                    let held = self.debt.min(u64::from(increment));
                    self.debt -= held;
                    let rest = increment - held as u32;
                    if rest > 0 && self.backend.is_some() {
                        frame::window_update(&mut self.to_backend, 0, rest);
                    }
                    self.release_held();
                    self.flush_replies();
                } else if let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&head.stream) {
                    t.window += i64::from(increment);
                    self.flush_reply(head.stream);
                } else {
                    self.send_backend(&raw);
                }
                Ok(())
            }
            kind::RST_STREAM => {
                match self.streams.get(&head.stream).map(|s| matches!(s.kind, StreamKind::TakenOver(_))) {
                    // The task sees its cancel sender dropped, and records the call itself.
                    Some(true) => {
                        self.streams.remove(&head.stream);
                    }
                    Some(false) => {
                        self.send_backend(&raw);
                        self.end_stream(head.stream, Status::new(Code::CANCELLED, "client reset the call"));
                    }
                    None => self.send_backend(&raw),
                }
                Ok(())
            }
            // PRIORITY, GOAWAY, PUSH_PROMISE (a client must not send it: the runtime says so),
            // and frame types this relay does not know (which peers ignore).
            _ => {
                self.send_backend(&raw);
                Ok(())
            }
        }
    }

    fn client_data(&mut self, head: Head, raw: BytesMut) -> Result<(), Fatal> {
        let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&head.stream) else {
            if self.backend.is_some() {
                self.send_backend(&raw);
            } else if head.len > 0 {
                frame::window_update(&mut self.to_client, 0, head.len as u32);
            }
            return Ok(());
        };
        let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
        // The runtime never sees these bytes: the client gets its window back from the relay.
        if head.len > 0 {
            frame::window_update(&mut self.to_client, 0, head.len as u32);
            if !head.has(flag::END_STREAM) {
                frame::window_update(&mut self.to_client, head.stream, head.len as u32);
            }
        }
        t.received += range.len();
        if let Some(body) = &t.body {
            if range.end > range.start {
                let chunk = raw.freeze().slice(HEAD_LEN + range.start..HEAD_LEN + range.end);
                if body.send(Ok(chunk)).is_err() {
                    t.body = None;
                }
            }
        }
        if head.has(flag::END_STREAM) {
            t.body = None;
            t.client_done = true;
            let replied = t.replied;
            if replied {
                self.streams.remove(&head.stream);
            }
        }
        Ok(())
    }

    /// A whole header block from the client: decoded, forwarded, and a new call routed.
    fn client_block(&mut self, mut block: Block) -> Result<(), Fatal> {
        self.headers.clear();
        let headers = &mut self.headers;
        self.c_hpack
            .decode(&mut Cursor::new(&mut block.fragment), |h| {
                headers.push(h);
                ControlFlow::Continue(())
            })
            .map_err(|_| Fatal(reason::COMPRESSION_ERROR, "cannot decode a header block"))?;
        let id = block.stream;
        let end_stream = block.flags & flag::END_STREAM != 0;
        if id <= self.last_stream || id % 2 == 0 {
            // Trailers of a call the client streams to (or a peer error the runtime reports).
            self.send_backend(&block.raw);
            if let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&id) {
                if end_stream {
                    t.body = None;
                    t.client_done = true;
                }
            }
            return Ok(());
        }
        self.last_stream = id;
        let Some(path) = self.headers.iter().find_map(|h| match h {
            Header::Path(p) => Some(Box::<str>::from(&**p)),
            _ => None,
        }) else {
            self.send_backend(&block.raw);
            return Ok(());
        };
        if let Closing::Final(last) = self.closing {
            if id > last {
                // Refused by the final GOAWAY: the client knows; the runtime must not run it.
                self.send_backend(&block.raw);
                self.reset_at_backend(id);
                return Ok(());
            }
        }
        let start = Instant::now();
        if let Some(gone) = self.gone.clone() {
            // No runtime connection to relay on: the call goes over the shared one, which
            // answers UNAVAILABLE naming the socket while the runtime is down. Once it is back,
            // the client is asked to come back on a new, relayed, connection.
            if self.closing == Closing::Open && self.runtime.reachable() {
                tracing::info!(backend = %self.runtime.path().display(), "backend reachable again; asking the client to reconnect");
                self.begin_close();
            }
            if path.ends_with("/GetContainerEvents") {
                // A stream cannot be taken over whole; the client opens it again on the new
                // connection.
                let status = Status::new(Code::UNAVAILABLE, format!("{path}: {gone}"));
                self.answer_status(id, &status);
                self.router.record(&path, &status, start.elapsed());
                return Ok(());
            }
            let route = match self.router.route(&path) {
                Route::Relay => Route::Unary,
                other => other,
            };
            self.take_over(id, path, route, end_stream);
            return Ok(());
        }
        self.send_backend(&block.raw);
        if self.streams.len() >= self.max_streams as usize {
            self.reset_at_backend(id);
            frame::rst_stream(&mut self.to_client, id, reason::REFUSED_STREAM);
            return Ok(());
        }
        let route = self.router.route(&path);
        if let Route::Relay = route {
            let deadline = self.headers.iter().find_map(|h| match h {
                Header::Field { name, value } if name == "grpc-timeout" => grpc::parse_timeout_value(value).map(|d| start + d),
                _ => None,
            });
            if let Some(d) = deadline {
                self.arm(d);
            }
            self.streams.insert(id, Stream { method: path, start, kind: StreamKind::Relayed { deadline, head_sent: false } });
            return Ok(());
        }
        self.reset_at_backend(id);
        self.take_over(id, path, route, end_stream);
        Ok(())
    }

    /// Starts the task of a taken-over call.
    fn take_over(&mut self, id: u32, path: Box<str>, route: Route, end_stream: bool) {
        let start = Instant::now();
        let parts = request_parts(&self.headers, &path);
        let (body_tx, body) = mpsc::unbounded_channel();
        let (cancel, cancelled) = oneshot::channel();
        let taken = TakenOver {
            body: (!end_stream).then_some(body_tx),
            received: 0,
            _cancel: cancel,
            client_done: end_stream,
            window: self.client_initial_window,
            reply: None,
            replied: false,
        };
        self.streams.insert(id, Stream { method: path.clone(), start, kind: StreamKind::TakenOver(taken) });
        let (router, replies) = (self.router.clone(), self.replies_tx.clone());
        self.tasks.spawn(Box::pin(async move {
            let method: &str = &path;
            let outcome = tokio::select! {
                outcome = take_over_call(&router, route, method, parts, body) => outcome,
                _ = cancelled => {
                    router.record(method, &Status::new(Code::CANCELLED, "client reset the call"), start.elapsed());
                    return;
                }
            };
            let (answer, post) = match outcome {
                Ok((answer, post)) => (Ok(answer), post),
                Err(status) => (Err(status), None),
            };
            let status = match &answer {
                Ok(a) => a.status(),
                Err(s) => s.clone(),
            };
            let _ = replies.send(Reply { stream: id, answer });
            if let Some(post) = post {
                post.await;
            }
            router.record(method, &status, start.elapsed());
        }));
    }

    // ===== runtime → client =====

    fn backend_bytes(&mut self) -> Result<(), Fatal> {
        while self.b_held.is_none() && self.b_in.len() >= HEAD_LEN {
            let head = Head::parse(&self.b_in);
            if head.len > self.client_max_frame.max(frame::DEFAULT_MAX_FRAME) {
                return Err(Fatal(reason::FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE"));
            }
            if self.b_in.len() < HEAD_LEN + head.len {
                self.b_in.reserve(HEAD_LEN + head.len - self.b_in.len());
                break;
            }
            let raw = self.b_in.split_to(HEAD_LEN + head.len);
            self.backend_frame(head, raw)?;
            if self.backend.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn backend_frame(&mut self, head: Head, raw: BytesMut) -> Result<(), Fatal> {
        if head.kind == kind::CONTINUATION || self.b_block.is_some() {
            let Some(block) = &mut self.b_block else { return Err(Fatal(reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS")) };
            if head.kind != kind::CONTINUATION || head.stream != block.stream {
                return Err(Fatal(reason::PROTOCOL_ERROR, "header block interrupted"));
            }
            block.fragment.extend_from_slice(&raw[HEAD_LEN..]);
            block.raw.extend_from_slice(&raw);
            if block.fragment.len() > MAX_HEADER_LIST_SIZE as usize {
                return Err(Fatal(reason::PROTOCOL_ERROR, "header block too large"));
            }
            if head.has(flag::END_HEADERS) {
                let block = self.b_block.take().expect("checked above");
                return self.backend_block(block);
            }
            return Ok(());
        }
        let relayed = matches!(self.streams.get(&head.stream), Some(Stream { kind: StreamKind::Relayed { .. }, .. }));
        match head.kind {
            kind::DATA => {
                if !relayed {
                    // A stream the relay ended or took over: the runtime gets its window back.
                    if head.len > 0 {
                        frame::window_update(&mut self.to_backend, 0, head.len as u32);
                    }
                    return Ok(());
                }
                if (head.len as i64) > self.client_window {
                    self.b_held = Some((head, raw));
                    return Ok(());
                }
                self.forward_data(head, raw);
                Ok(())
            }
            kind::HEADERS => {
                let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
                let fragment = BytesMut::from(&raw[HEAD_LEN + range.start..HEAD_LEN + range.end]);
                let block = Block { stream: head.stream, flags: head.flags, raw, fragment };
                if head.has(flag::END_HEADERS) {
                    self.backend_block(block)
                } else {
                    self.b_block = Some(block);
                    Ok(())
                }
            }
            kind::SETTINGS if !head.has(flag::ACK) => {
                let mut entries: Vec<(u16, u32)> = frame::settings_entries(&raw[HEAD_LEN..]).collect();
                let mut capped = false;
                for (id, value) in &mut entries {
                    match *id {
                        setting::HEADER_TABLE_SIZE => self.c_hpack.queue_size_update(*value as usize),
                        setting::MAX_FRAME_SIZE => self.backend_max_frame = *value as usize,
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
                Ok(())
            }
            kind::PUSH_PROMISE => Err(Fatal(reason::PROTOCOL_ERROR, "PUSH_PROMISE from a gRPC server")),
            kind::WINDOW_UPDATE | kind::RST_STREAM | kind::PRIORITY if head.stream != 0 && !relayed => Ok(()),
            kind::RST_STREAM => {
                self.to_client.extend_from_slice(&raw);
                let code = if head.len == 4 { u32::from_be_bytes([raw[9], raw[10], raw[11], raw[12]]) } else { reason::PROTOCOL_ERROR };
                let status = Status::new(Code::UNAVAILABLE, format!("stream reset by the backend: {}", h2::Reason::from(code)));
                self.end_stream(head.stream, status);
                Ok(())
            }
            // SETTINGS ACK, PING, GOAWAY, WINDOW_UPDATE, PRIORITY, unknown types.
            _ => {
                self.to_client.extend_from_slice(&raw);
                Ok(())
            }
        }
    }

    fn forward_data(&mut self, head: Head, raw: BytesMut) {
        self.client_window -= head.len as i64;
        self.to_client.extend_from_slice(&raw);
        if head.has(flag::END_STREAM) {
            self.end_stream(head.stream, Status::new(Code::UNKNOWN, "backend ended the call without a grpc-status"));
        }
    }

    /// Sends the held runtime DATA frame once the client's window has room, and reads on.
    fn release_held(&mut self) {
        if let Some((head, _)) = &self.b_held {
            if (head.len as i64) <= self.client_window {
                let (head, raw) = self.b_held.take().expect("checked");
                if matches!(self.streams.get(&head.stream), Some(Stream { kind: StreamKind::Relayed { .. }, .. })) {
                    self.forward_data(head, raw);
                }
                if let Err(Fatal(_, why)) = self.backend_bytes() {
                    self.backend_lost(format!("protocol error: {why}"));
                }
            }
        }
    }

    /// A whole header block from the runtime: the response head or trailers of a relayed call.
    fn backend_block(&mut self, mut block: Block) -> Result<(), Fatal> {
        self.headers.clear();
        let headers = &mut self.headers;
        self.b_hpack
            .decode(&mut Cursor::new(&mut block.fragment), |h| {
                headers.push(h);
                ControlFlow::Continue(())
            })
            .map_err(|_| Fatal(reason::COMPRESSION_ERROR, "cannot decode a header block"))?;
        let id = block.stream;
        let end_stream = block.flags & flag::END_STREAM != 0;
        let Some(Stream { kind: StreamKind::Relayed { head_sent, .. }, .. }) = self.streams.get_mut(&id) else {
            // Not forwardable: from now on the client's table is left as it is.
            self.b_verbatim = false;
            return Ok(());
        };
        *head_sent = true;
        if self.b_verbatim {
            self.to_client.extend_from_slice(&block.raw);
        } else {
            let mut out = BytesMut::with_capacity(block.raw.len() + 64);
            for h in &self.headers {
                match h {
                    Header::Status(s) => frame::put_status(&mut out, s.as_u16()),
                    Header::Field { name, value } => frame::put_literal(&mut out, name.as_str().as_bytes(), value.as_bytes()),
                    _ => {}
                }
            }
            frame::put_headers(&mut self.to_client, id, end_stream, &out, self.client_max_frame);
        }
        if end_stream {
            let status = status_of(&self.headers);
            self.end_stream(id, status);
        }
        Ok(())
    }

    // ===== the proxy's own answers =====

    /// Ends a call in the relay's books and records it.
    fn end_stream(&mut self, id: u32, status: Status) {
        if let Some(stream) = self.streams.remove(&id) {
            self.router.record(&stream.method, &status, stream.start.elapsed());
        }
    }

    fn reset_at_backend(&mut self, id: u32) {
        if self.backend.is_some() {
            frame::rst_stream(&mut self.to_backend, id, reason::CANCEL);
        }
    }

    /// Answers stream `id` with `status`, trailers-only.
    fn answer_status(&mut self, id: u32, status: &Status) {
        let mut block = BytesMut::with_capacity(64 + status.message.len());
        frame::put_status(&mut block, 200);
        frame::put_literal(&mut block, b"content-type", b"application/grpc");
        put_status_fields(&mut block, status);
        frame::put_headers(&mut self.to_client, id, true, &block, self.client_max_frame);
    }

    /// Ends a relayed call with `status` from the proxy: trailers after its head, else
    /// trailers-only; the runtime's stream is reset.
    fn fail_relayed(&mut self, id: u32, status: Status) {
        let Some(Stream { kind: StreamKind::Relayed { head_sent, .. }, .. }) = self.streams.get(&id) else { return };
        if *head_sent {
            let mut block = BytesMut::with_capacity(32 + status.message.len());
            put_status_fields(&mut block, &status);
            frame::put_headers(&mut self.to_client, id, true, &block, self.client_max_frame);
        } else {
            self.answer_status(id, &status);
        }
        self.reset_at_backend(id);
        self.end_stream(id, status);
    }

    fn on_reply(&mut self, reply: Reply) {
        let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&reply.stream) else { return };
        t.reply = Some(match reply.answer {
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
            Err(status) => {
                let mut head = BytesMut::with_capacity(64 + status.message.len());
                frame::put_status(&mut head, 200);
                frame::put_literal(&mut head, b"content-type", b"application/grpc");
                put_status_fields(&mut head, &status);
                PendingReply { head: Some(head), data: Bytes::new(), trailers: None }
            }
        });
        self.flush_reply(reply.stream);
    }

    fn flush_replies(&mut self) {
        let ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| matches!(&s.kind, StreamKind::TakenOver(TakenOver { reply: Some(_), .. })))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.flush_reply(id);
        }
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
            let room = self.client_window.min(t.window).max(0) as usize;
            let n = room.min(reply.data.len());
            if n > 0 {
                let chunk = reply.data.split_to(n);
                let end = reply.data.is_empty() && reply.trailers.is_none();
                frame::put_data(&mut self.to_client, id, &chunk, end, self.client_max_frame);
                self.client_window -= n as i64;
                t.window -= n as i64;
                self.debt += n as u64;
            }
        }
        if reply.data.is_empty() {
            if let Some(trailers) = reply.trailers.take() {
                frame::put_headers(&mut self.to_client, id, true, &trailers, self.client_max_frame);
            }
            t.reply = None;
            t.replied = true;
            if t.client_done {
                self.streams.remove(&id);
            }
        }
    }

    // ===== deadlines, loss, closing =====

    fn arm(&mut self, deadline: Instant) {
        if self.next_deadline.is_some_and(|d| d <= deadline) && self.timer.is_some() {
            return;
        }
        self.next_deadline = Some(deadline);
        self.timer = Some(Box::pin(tokio::time::sleep_until(deadline.into())));
    }

    fn expire_deadlines(&mut self) {
        let now = Instant::now();
        self.next_deadline = None;
        let mut expired = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, s) in &self.streams {
            if let StreamKind::Relayed { deadline: Some(d), head_sent: false } = s.kind {
                if d <= now {
                    expired.push((*id, d.saturating_duration_since(s.start)));
                } else {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
        }
        for (id, timeout) in expired {
            let method = self.streams.get(&id).map(|s| s.method.clone()).unwrap_or_default();
            let status =
                Status::new(Code::DEADLINE_EXCEEDED, format!("{method}: deadline of {timeout:?} exceeded waiting for {}", self.runtime));
            self.fail_relayed(id, status);
        }
        if let Some(d) = next {
            self.arm(d);
        }
    }

    /// The runtime connection broke: relayed calls end `UNAVAILABLE`, new ones are answered so.
    fn backend_lost(&mut self, why: String) {
        if self.backend.take().is_none() {
            return;
        }
        tracing::warn!(backend = %self.runtime.path().display(), error = %why, "backend connection broken");
        self.runtime.connection_lost();
        self.to_backend.clear();
        self.b_in.clear();
        self.b_block = None;
        self.b_held = None;
        let relayed: Vec<u32> =
            self.streams.iter().filter(|(_, s)| matches!(s.kind, StreamKind::Relayed { .. })).map(|(id, _)| *id).collect();
        for id in relayed {
            let method = self.streams.get(&id).map(|s| s.method.clone()).unwrap_or_default();
            let status = Status::new(Code::UNAVAILABLE, format!("{method}: {} failed the call: {why}", self.runtime));
            self.fail_relayed(id, status);
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
            if let Some(Stream { kind: StreamKind::Relayed { .. }, .. }) = self.streams.get(&id) {
                self.end_stream(id, Status::new(Code::CANCELLED, "client went away"));
            }
        }
        self.streams.clear();
    }

    /// After the loop (whose last turn wrote what it could): calls still open are recorded as
    /// cancelled; both sockets close when the relay is dropped.
    fn finish(&mut self) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.end_stream(id, Status::new(Code::CANCELLED, "connection closed"));
        }
    }

    /// Queues `raw` for the runtime, if there is a runtime connection.
    fn send_backend(&mut self, raw: &[u8]) {
        if self.backend.is_some() {
            self.to_backend.extend_from_slice(raw);
        }
    }
}

/// The call of a taken-over stream: the interceptor's, or a unary call to the image backend.
async fn take_over_call<'a>(
    router: &'a Router,
    route: Route,
    method: &'a str,
    parts: Option<http::request::Parts>,
    body: RequestBody,
) -> Result<(Answer, Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>), Status> {
    let parts = parts.ok_or_else(|| Status::new(Code::INTERNAL, format!("{method}: not a valid request head")))?;
    let backend = router.backend_for(method);
    match (route, router.interceptor()) {
        (Route::Intercept(spec), Some(interceptor)) => {
            let (answer, post) = interceptor.intercept(spec, method, backend, parts, body).await?;
            Ok((answer, post.map(|p| Box::pin(p) as Pin<Box<dyn Future<Output = ()> + Send + 'a>>)))
        }
        _ => {
            let limits = router.interceptor().map(|i| i.limits.clone()).unwrap_or_default();
            let deadline = grpc::parse_timeout(&parts.headers);
            let body = intercept::read_body(body, method, &limits).await?;
            let answer = unary::unary(backend, Request::from_parts(parts, ()), body, deadline, method).await?;
            Ok((answer, None))
        }
    }
}

/// The request head of a taken-over call, from its decoded header block; `None` when the path
/// is not a valid URI path.
fn request_parts(headers: &[Header], path: &str) -> Option<http::request::Parts> {
    let mut authority = None;
    let mut map = HeaderMap::with_capacity(headers.len());
    for h in headers {
        match h {
            Header::Authority(a) => authority = Some(a.as_bytes().to_vec()),
            Header::Field { name, value } => {
                map.append(name.clone(), value.clone());
            }
            _ => {}
        }
    }
    let uri = router::default_uri(authority.as_deref(), path)?;
    let (mut parts, ()) = Request::builder().method(Method::POST).uri(uri).body(()).ok()?.into_parts();
    parts.headers = map;
    Some(parts)
}

/// The status a block of trailers (or a trailers-only head) carries; `UNKNOWN` without one.
fn status_of(headers: &[Header]) -> Status {
    let mut code = None;
    let mut message = "";
    for h in headers {
        if let Header::Field { name, value } = h {
            if name == "grpc-status" {
                code = value.to_str().ok().and_then(|v| v.parse::<u16>().ok());
            } else if name == "grpc-message" {
                message = value.to_str().unwrap_or("");
            }
        }
    }
    match code {
        Some(c) => Status::new(Code(c), message),
        None => Status::new(Code::UNKNOWN, "backend ended the call without a grpc-status"),
    }
}

fn put_fields(out: &mut BytesMut, headers: &HeaderMap) {
    for (name, value) in headers {
        frame::put_literal(out, name.as_str().as_bytes(), value.as_bytes());
    }
}

fn put_status_fields(out: &mut BytesMut, status: &Status) {
    put_fields(out, &status.trailers());
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
