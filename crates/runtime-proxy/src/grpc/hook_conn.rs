//! One hook server connection and the HTTP/2 the client speaks on it (see the parent module's
//! docs): the request written and the answer read by the calling task, what arrives while it is
//! idle taken by the watcher, within the bounds the parent module sets.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{
    Failure, Unfit, BYTES_PER_WAKE, CALL_CONTROL_FRAMES, FRAMES_PER_WAKE, IDLE_FRAMES_WINDOW, MAX_IDLE_FRAMES,
    MAX_IDLE_PARTIAL, MAX_PENDING_ACKS, WRITE_STALL,
};
use crate::grpc::backend::{CONNECTION_WINDOW, MAX_HEADER_LIST_SIZE, STREAM_WINDOW};
use crate::grpc::unary_call::{Answer, Body, TooLarge};
use crate::http2::frame::{
    self, flag, kind, reason, setting, Head, DEFAULT_MAX_FRAME, DEFAULT_WINDOW, HEAD_LEN, PREFACE,
};
use crate::http2::hpack;
use daemon_support::uds::Socket;

/// Most fields in one header block of an answer.
const MAX_FIELDS: usize = 4096;

/// Bytes read from a socket at once.
const READ_CHUNK: usize = 16 << 10;

/// SETTINGS_ENABLE_PUSH (RFC 9113 §6.5.2).
const ENABLE_PUSH: u16 = 0x2;
/// SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 §6.5.2).
const MAX_HEADER_LIST: u16 = 0x6;

/// Highest stream ID a client may open (RFC 9113 §5.1.1: 31 bits, odd).
pub(super) const LAST_STREAM_ID: u32 = (1 << 31) - 1;

/// What a frame of the answer's stream carried.
enum Event {
    /// DATA of a stream (its payload without padding), with END_STREAM or not.
    Data { stream: u32, end: bool, data: Bytes },
    /// A header block of a stream, decoded into `Conn::fields`, with END_STREAM or not.
    Headers { stream: u32, end: bool },
    /// RST_STREAM with its error code.
    Reset { stream: u32, reason: u32 },
}

/// What `Conn::next_frame` took from what was read.
enum Frame {
    /// What was read ends before the next frame (or header block) does.
    Incomplete,
    /// A frame of the connection's own, or one ignored (PRIORITY, unknown types), handled.
    Control,
    /// A frame of a stream.
    Event(Event),
}

/// One connection and the HTTP/2 state the client keeps for it.
pub(super) struct Conn {
    io: Socket,
    /// Bytes read and not yet taken as frames: at most one unfinished frame (or header block)
    /// and one read's worth, as frames are taken before more is read.
    pub(super) read: BytesMut,
    /// Frames to write, the bytes not yet written.
    pub(super) out: BytesMut,
    /// PING and SETTINGS acknowledgements in `out` (at most [`MAX_PENDING_ACKS`]).
    pub(super) acks: usize,
    /// `out` holds frames the open exchange waits on (the request, window updates): written
    /// before more is read. Acknowledgements alone are written as the socket takes them.
    must_send: bool,
    /// Since when a write has found the socket full (none: `out` empty or last written whole).
    pub(super) blocked_since: Option<tokio::time::Instant>,
    /// Frames received while idle since `idle_frames_since` (see [`MAX_IDLE_FRAMES`]).
    idle_frames: u32,
    idle_frames_since: tokio::time::Instant,
    /// Frames taken and bytes read by a call since it last yielded to the runtime.
    wake_frames: usize,
    wake_bytes: usize,
    /// Frames besides its answer's the open call may still take (see [`CALL_CONTROL_FRAMES`]).
    control_left: usize,
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
    pub(super) fn new(io: Socket) -> Conn {
        let mut out = BytesMut::with_capacity(8 << 10);
        out.extend_from_slice(PREFACE);
        frame::settings(
            &mut out,
            &[(ENABLE_PUSH, 0), (setting::INITIAL_WINDOW_SIZE, STREAM_WINDOW), (MAX_HEADER_LIST, MAX_HEADER_LIST_SIZE)],
        );
        frame::window_update(&mut out, 0, CONNECTION_WINDOW - DEFAULT_WINDOW as u32);
        Conn {
            io,
            read: BytesMut::with_capacity(READ_CHUNK),
            out,
            acks: 0,
            must_send: true,
            blocked_since: None,
            idle_frames: 0,
            idle_frames_since: tokio::time::Instant::now(),
            wake_frames: 0,
            wake_bytes: 0,
            control_left: 0,
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
    pub(super) fn usable(&self) -> bool {
        !self.broken && self.goaway.is_none() && self.next_stream <= LAST_STREAM_ID
    }

    /// Makes an idle connection ready for a call without waiting: reads what arrived while it
    /// was idle and takes its frames (SETTINGS, PING, GOAWAY, window updates; frames of streams
    /// ended before), and writes the acknowledgements they ask for.
    ///
    /// Errors: the connection ended, broke, or the server is going away; more than one
    /// wake-up's frames were waiting ([`FRAMES_PER_WAKE`], [`BYTES_PER_WAKE`]), or the
    /// acknowledgements cannot be written at once (the server does not read): a call on it
    /// would wait on the server's flood.
    pub(super) fn revive(&mut self) -> Result<(), Unfit> {
        let cx = &mut Context::from_waker(Waker::noop());
        if self.pump_idle(cx)? {
            return Err(Unfit::bound(format!(
                "more than {FRAMES_PER_WAKE} frames or {} KiB were waiting on the idle connection",
                BYTES_PER_WAKE >> 10
            )));
        }
        if !self.usable() {
            return Err(Unfit::ended("the server is going away (GOAWAY)"));
        }
        match self.poll_write_out(cx) {
            Poll::Ready(Ok(())) => Ok(()),
            Poll::Ready(Err(e)) => Err(Unfit::ended(e)),
            Poll::Pending => Err(Unfit::bound(format!(
                "{} bytes of acknowledgements cannot be written: the server does not read",
                self.out.len()
            ))),
        }
    }

    /// Whether an idle connection is to be kept, after reading what arrived on it (at most
    /// one wake-up's worth: `cx` is woken again when more is there) and writing the
    /// acknowledgements that asks for (`cx` woken when more arrives, or the socket takes more).
    ///
    /// Errors: it ended, broke, or the server is going away or broke the protocol; more than
    /// [`MAX_PENDING_ACKS`] acknowledgements unwritten, more than [`MAX_IDLE_FRAMES`] frames
    /// within [`IDLE_FRAMES_WINDOW`], an unfinished header block over [`MAX_IDLE_PARTIAL`]
    /// bytes, or a write blocked for [`WRITE_STALL`].
    pub(super) fn tend(&mut self, cx: &mut Context<'_>) -> Result<(), Unfit> {
        if let Poll::Ready(Err(e)) = self.poll_write_out(cx) {
            return Err(Unfit::ended(e));
        }
        let more = self.pump_idle(cx)?;
        if !self.usable() {
            return Err(Unfit::ended("the server is going away (GOAWAY)"));
        }
        if let Poll::Ready(Err(e)) = self.poll_write_out(cx) {
            return Err(Unfit::ended(e));
        }
        if let Some(since) = self.blocked_since {
            if since.elapsed() >= WRITE_STALL {
                return Err(Unfit::bound(format!(
                    "its writes were blocked for {} s ({} bytes unwritten): the server does not read",
                    WRITE_STALL.as_secs(),
                    self.out.len()
                )));
            }
        }
        if more {
            // Polled again once the runtime has polled its I/O and timers (as `yield_now` does):
            // woken at once instead, the watcher could run again and again before a timer due
            // meanwhile fires.
            let _ = std::pin::pin!(tokio::task::yield_now()).poll(cx);
        }
        Ok(())
    }

    /// When an idle connection's blocked write makes it unfit (see [`Conn::tend`]).
    pub(super) fn stall_deadline(&self) -> Option<tokio::time::Instant> {
        self.blocked_since.map(|since| since + WRITE_STALL)
    }

    /// Reads and takes the frames of an idle connection, at most [`FRAMES_PER_WAKE`] frames
    /// and [`BYTES_PER_WAKE`] bytes; whether that budget ran out with more to do (else the
    /// socket has nothing more, and `cx` is woken when it has).
    ///
    /// Errors: see [`Conn::tend`].
    fn pump_idle(&mut self, cx: &mut Context<'_>) -> Result<bool, Unfit> {
        let (mut frames, mut bytes) = (0, 0);
        loop {
            loop {
                match self.next_frame().map_err(Unfit::ended)? {
                    Frame::Incomplete => break,
                    // Frames of streams ended before: ignored, like the connection's own.
                    Frame::Control | Frame::Event(_) => {}
                }
                self.count_idle_frame()?;
                if self.acks > MAX_PENDING_ACKS {
                    return Err(self.too_many_acks());
                }
                frames += 1;
                if frames >= FRAMES_PER_WAKE {
                    return Ok(true);
                }
            }
            if self.read.len() > MAX_IDLE_PARTIAL {
                return Err(Unfit::bound(format!(
                    "a header block of more than {} KiB on the idle connection, where no stream is open",
                    MAX_IDLE_PARTIAL >> 10
                )));
            }
            if bytes >= BYTES_PER_WAKE {
                return Ok(true);
            }
            match self.poll_read_some(cx) {
                Poll::Ready(Ok(n)) => bytes += n,
                Poll::Ready(Err(e)) => return Err(Unfit::ended(e)),
                Poll::Pending => return Ok(false),
            }
        }
    }

    /// Counts a frame received while idle against [`MAX_IDLE_FRAMES`].
    fn count_idle_frame(&mut self) -> Result<(), Unfit> {
        self.idle_frames += 1;
        if self.idle_frames > MAX_IDLE_FRAMES {
            let now = tokio::time::Instant::now();
            if now.duration_since(self.idle_frames_since) < IDLE_FRAMES_WINDOW {
                return Err(Unfit::bound(format!(
                    "more than {MAX_IDLE_FRAMES} frames within {} s on the idle connection",
                    IDLE_FRAMES_WINDOW.as_secs()
                )));
            }
            self.idle_frames = 1;
            self.idle_frames_since = now;
        }
        Ok(())
    }

    fn too_many_acks(&self) -> Unfit {
        Unfit::bound(format!(
            "more than {MAX_PENDING_ACKS} PING and SETTINGS acknowledgements unwritten: the server sends them faster than it reads"
        ))
    }

    /// Writes `out` as far as the socket takes it; ready once it is all written (`cx` woken
    /// when the socket takes more).
    ///
    /// Errors: the connection broke.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        while !self.out.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, &self.out) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err("connection broken: the socket takes no more".into())),
                Poll::Ready(Ok(n)) => bytes::Buf::advance(&mut self.out, n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(format!("connection broken: {e}"))),
                Poll::Pending => {
                    self.blocked_since.get_or_insert_with(tokio::time::Instant::now);
                    return Poll::Pending;
                }
            }
        }
        self.out.clear();
        self.acks = 0;
        self.must_send = false;
        self.blocked_since = None;
        Poll::Ready(Ok(()))
    }

    /// Reads once, at most [`READ_CHUNK`] bytes, into `read`; how many.
    ///
    /// Errors: the connection was closed or broke.
    fn poll_read_some(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, String>> {
        self.read.reserve(READ_CHUNK);
        let spare = &mut self.read.spare_capacity_mut()[..READ_CHUNK];
        let mut buf = ReadBuf::uninit(spare);
        match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len();
                if n == 0 {
                    return Poll::Ready(Err("connection closed by the server".into()));
                }
                // SAFETY: poll_read initialised the first `n` bytes of the spare capacity.
                unsafe { self.read.set_len(self.read.len() + n) };
                self.wake_bytes += n;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(format!("connection broken: {e}"))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// One exchange on a new stream: the request (`block`, then `body`), the answer collected
    /// (its body at most `max_data` bytes). `reused`: the connection was taken idle, so a
    /// request that cannot be written did not reach the server. Acknowledgements the answer
    /// did not wait for are written if the socket takes them now, else left to the watcher.
    pub(super) async fn exchange(
        &mut self,
        block: &[u8],
        body: &Bytes,
        max_data: usize,
        reused: bool,
    ) -> Result<Answer, Failure> {
        let result = self.run(block, body, max_data, reused).await;
        if result.is_err() {
            self.broken = true;
        } else if !self.out.is_empty() {
            if let Poll::Ready(Err(_)) = self.poll_write_out(&mut Context::from_waker(Waker::noop())) {
                self.broken = true;
            }
        }
        result
    }

    async fn run(&mut self, block: &[u8], body: &Bytes, max_data: usize, reused: bool) -> Result<Answer, Failure> {
        let stream = self.next_stream;
        self.next_stream += 2;
        self.stream_window = self.initial_window;
        self.stream_unacked = 0;
        self.control_left = CALL_CONTROL_FRAMES + body.len() / 1024;
        (self.wake_frames, self.wake_bytes) = (0, 0);
        frame::put_headers(&mut self.out, stream, body.is_empty(), block, self.max_frame);
        self.must_send = true;
        let (mut sent, mut first_write) = (0, true);
        let mut head: Option<Response<()>> = None;
        let mut data = Body::new(max_data);
        loop {
            if sent < body.len() {
                let room = self.conn_window.min(self.stream_window).max(0) as usize;
                let n = room.min(body.len() - sent);
                if n > 0 {
                    frame::put_data(
                        &mut self.out,
                        stream,
                        &body.slice(sent..sent + n),
                        sent + n == body.len(),
                        self.max_frame,
                    );
                    sent += n;
                    self.conn_window -= n as i64;
                    self.stream_window -= n as i64;
                    self.must_send = true;
                }
            }
            if self.must_send {
                if let Err(e) = std::future::poll_fn(|cx| self.poll_write_out(cx)).await {
                    let why = format!("cannot write the request: {e}");
                    return Err(if reused && first_write { Failure::Unprocessed(why) } else { Failure::Broken(why) });
                }
                first_write = false;
            }
            let Some(event) = self.next_stream_event(stream, sent < body.len()).await? else { continue };
            match event {
                // Empty DATA that does not end the stream carries nothing: counted as control.
                Event::Data { stream: s, end: false, data: chunk } if s == stream && chunk.is_empty() => {
                    self.spend_control()?
                }
                Event::Data { stream: s, end, data: chunk } if s == stream => {
                    data.push(chunk).map_err(|TooLarge| Failure::TooLarge)?;
                    if end {
                        let head = head.ok_or_else(|| Failure::Broken("DATA before the response headers".into()))?;
                        return self
                            .answered(sent == body.len(), Answer { head, data: data.into_bytes(), trailers: None });
                    }
                    if self.stream_unacked >= STREAM_WINDOW / 2 {
                        frame::window_update(&mut self.out, stream, self.stream_unacked);
                        self.stream_unacked = 0;
                        self.must_send = true;
                    }
                }
                Event::Headers { stream: s, end } if s == stream => match head {
                    None => {
                        let response = response_head(&self.fields).map_err(Failure::Broken)?;
                        if response.status().is_informational() {
                            self.spend_control()?;
                            continue;
                        }
                        if end {
                            return self.answered(
                                sent == body.len(),
                                Answer { head: response, data: Bytes::new(), trailers: None },
                            );
                        }
                        head = Some(response);
                    }
                    Some(head) if end => {
                        let data = data.into_bytes();
                        return self.answered(
                            sent == body.len(),
                            Answer { head, data, trailers: Some(header_map(&self.fields)) },
                        );
                    }
                    Some(_) => return Err(Failure::Broken("trailers without END_STREAM".into())),
                },
                Event::Reset { stream: s, reason: code } if s == stream => {
                    let why = format!("stream reset by the server: {}", reason_name(code));
                    return Err(if code == reason::REFUSED_STREAM {
                        Failure::Unprocessed(why)
                    } else {
                        Failure::Broken(why)
                    });
                }
                // Frames of streams ended before.
                _ => self.spend_control()?,
            }
        }
    }

    /// Counts a frame of the open call besides its answer's against its allowance.
    ///
    /// Errors: the allowance is spent (see [`CALL_CONTROL_FRAMES`]).
    fn spend_control(&mut self) -> Result<(), Failure> {
        self.control_left = self.control_left.checked_sub(1).ok_or_else(|| {
            Failure::Broken(format!(
                "more frames besides the answer's (PING, SETTINGS, WINDOW_UPDATE, other streams') than a call takes \
                 ({CALL_CONTROL_FRAMES} plus one per KiB of request)"
            ))
        })?;
        Ok(())
    }

    /// The next frame event, read as needed; `None` when something is to be written first
    /// (the request, window updates, or — `sending` — request DATA the server's WINDOW_UPDATE
    /// made room for). Acknowledgements are written meanwhile as the socket takes them; the
    /// task yields to the runtime every [`FRAMES_PER_WAKE`] frames or [`BYTES_PER_WAKE`] bytes.
    ///
    /// Errors: the server broke the protocol or the connection, or passed
    /// [`MAX_PENDING_ACKS`] or the call's allowance of other frames; `Unprocessed` once a
    /// GOAWAY says the open stream (`stream`) was not processed.
    async fn next_stream_event(&mut self, stream: u32, sending: bool) -> Result<Option<Event>, Failure> {
        loop {
            let frame = self.next_frame().map_err(Failure::Broken)?;
            if !matches!(frame, Frame::Incomplete) {
                self.wake_frames += 1;
            }
            if self.wake_frames >= FRAMES_PER_WAKE || self.wake_bytes >= BYTES_PER_WAKE {
                (self.wake_frames, self.wake_bytes) = (0, 0);
                tokio::task::yield_now().await;
            }
            match frame {
                Frame::Event(event) => return Ok(Some(event)),
                Frame::Control => {
                    self.spend_control()?;
                    if self.acks > MAX_PENDING_ACKS {
                        // Written now if the socket takes them, without waiting.
                        if let Poll::Ready(Err(e)) = self.poll_write_out(&mut Context::from_waker(Waker::noop())) {
                            return Err(Failure::Broken(e));
                        }
                        if self.acks > MAX_PENDING_ACKS {
                            return Err(Failure::Broken(self.too_many_acks().why));
                        }
                    }
                }
                Frame::Incomplete => {
                    if let Some(last) = self.goaway.filter(|last| *last < stream) {
                        return Err(Failure::Unprocessed(format!(
                            "the server is going away (GOAWAY, last stream {last})"
                        )));
                    }
                    if self.must_send || (sending && self.conn_window.min(self.stream_window) > 0) {
                        return Ok(None);
                    }
                    std::future::poll_fn(|cx| self.poll_fill(cx)).await.map_err(Failure::Broken)?;
                }
            }
        }
    }

    /// Reads once more into `read`, writing meanwhile what acknowledgements `out` holds as the
    /// socket takes them.
    ///
    /// Errors: the connection was closed or broke.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        if let Poll::Ready(Err(e)) = self.poll_write_out(cx) {
            return Poll::Ready(Err(e));
        }
        self.poll_read_some(cx).map_ok(|_| ())
    }

    /// The answer of the open stream; `sent_all`: the whole request went out. A server that
    /// answered before it did left the stream not cleanly closed: the connection is not used
    /// again.
    fn answered(&mut self, sent_all: bool, answer: Answer) -> Result<Answer, Failure> {
        self.broken |= !sent_all;
        Ok(answer)
    }

    /// Takes the next whole frame (a header block with its CONTINUATIONs) from `read`: a frame
    /// of the connection's own (SETTINGS, PING, WINDOW_UPDATE, GOAWAY) is handled (its
    /// acknowledgement queued in `out`), PRIORITY and unknown types ignored.
    ///
    /// Errors: a protocol error of the server's, which ends the connection.
    fn next_frame(&mut self) -> Result<Frame, String> {
        let Some((head, end)) = self.whole_frame()? else { return Ok(Frame::Incomplete) };
        let frame = self.read.split_to(end).freeze();
        let payload = frame.slice(HEAD_LEN..HEAD_LEN + head.len);
        match head.kind {
            kind::DATA => {
                if head.stream == 0 {
                    return Err("DATA on stream 0".into());
                }
                self.received(head.len as u32);
                let range = frame::unpadded(&head, &payload).ok_or("DATA padding longer than the frame")?;
                return Ok(Frame::Event(Event::Data {
                    stream: head.stream,
                    end: head.has(flag::END_STREAM),
                    data: payload.slice(range),
                }));
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
                return Ok(Frame::Event(Event::Headers { stream: head.stream, end: head.has(flag::END_STREAM) }));
            }
            kind::RST_STREAM if payload.len() == 4 => {
                let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                return Ok(Frame::Event(Event::Reset { stream: head.stream, reason: code }));
            }
            kind::SETTINGS if !head.has(flag::ACK) => {
                for (id, value) in frame::settings_entries(&payload) {
                    self.setting(id, value)?;
                }
                frame::settings_ack(&mut self.out);
                self.acks += 1;
            }
            kind::PING if payload.len() == 8 && !head.has(flag::ACK) => {
                let mut opaque = [0; 8];
                opaque.copy_from_slice(&payload);
                frame::ping(&mut self.out, true, &opaque);
                self.acks += 1;
            }
            // Its acknowledgement.
            kind::PING if payload.len() == 8 => {}
            kind::GOAWAY if payload.len() >= 8 => {
                self.goaway =
                    Some(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & LAST_STREAM_ID);
            }
            kind::WINDOW_UPDATE if payload.len() == 4 => {
                let increment =
                    i64::from(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & LAST_STREAM_ID);
                let window = if head.stream == 0 {
                    &mut self.conn_window
                } else if head.stream + 2 == self.next_stream {
                    &mut self.stream_window
                } else {
                    return Ok(Frame::Control);
                };
                *window += increment;
                if *window > i64::from(LAST_STREAM_ID) {
                    return Err(format!("WINDOW_UPDATE past the largest window, 2^31 - 1 (stream {})", head.stream));
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
        Ok(Frame::Control)
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
        // DATA for the last stream after it ended (on an idle connection) adds up here too.
        self.stream_unacked = self.stream_unacked.saturating_add(len);
        if self.conn_unacked >= CONNECTION_WINDOW / 2 {
            frame::window_update(&mut self.out, 0, self.conn_unacked);
            self.conn_unacked = 0;
            self.must_send = true;
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
    let status = StatusCode::from_bytes(status)
        .map_err(|_| format!(":status {:?} is not a status code", String::from_utf8_lossy(status)))?;
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
