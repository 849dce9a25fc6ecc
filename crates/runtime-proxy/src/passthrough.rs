//! The generic pass-through: forwards one call to a backend as it is and streams the answer back.
//!
//! The request's headers (gRPC metadata such as `traceparent`, `grpc-timeout`), body frames and
//! trailers are sent on unchanged; the response's status, headers, body frames and trailers
//! (`grpc-status`, `grpc-message`, `grpc-status-details-bin`) come back unchanged. Nothing is
//! decoded, so it serves every method, stream and service, known or not, and imposes no message
//! size limit of its own. A reset on either side (a client giving up, a backend aborting a call)
//! is passed on to the other; a backend connection that breaks ends the call `UNAVAILABLE` naming
//! the socket.
//!
//! It works on raw HTTP/2 streams (the `h2` crate) rather than a body abstraction so that a
//! unary call's head and first body frame leave in one write: the proxy's added latency is about
//! one read and one write per direction.

use std::future::poll_fn;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, Request, Response};

use crate::backend::Backend;
use crate::grpc::{self, Code, Status};

/// Forwards the call `req` to `backend`, answering through `respond`, and returns the call's
/// final status (from the backend's trailers, or the proxy's own) for logging and metrics.
///
/// `deadline` is the caller's `grpc-timeout`: the backend enforces it too (the header travels
/// with the call), and the proxy gives up waiting for the response head when it expires, so a
/// hung backend cannot hold a call past the kubelet's deadline.
///
/// Statuses the proxy answers itself: `UNAVAILABLE` naming the method and backend when the
/// backend cannot be reached (see [`Backend::open_stream`]) or its connection breaks, before or
/// after the response head (then as trailers); `DEADLINE_EXCEEDED` naming the method and backend.
/// A call the backend resets (`RST_STREAM`) is reset for the client with the same reason, as
/// the client would see it directly. A client that goes away yields `CANCELLED` (nothing is sent;
/// the backend stream is reset).
pub async fn forward(
    backend: &Backend,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    deadline: Option<Duration>,
    method: &str,
) -> Status {
    let (parts, body) = req.into_parts();
    let request_done = body.is_end_stream();
    let (response, upstream) = match backend.open_stream(Request::from_parts(parts, ()), request_done).await {
        Ok(opened) => opened,
        Err(status) => return reply(&mut respond, status),
    };

    let upload = async move {
        let mut upstream = upstream;
        if request_done {
            return Ok(None);
        }
        let sent = pipe(body, &mut upstream).await;
        if let Err(PipeError::Broken(e)) = &sent {
            // The client's side broke: the backend's call is reset with the same reason.
            upstream.send_reset(e.reason().unwrap_or(Reason::CANCEL));
        }
        sent
    };
    tokio::pin!(upload);
    let mut upload_done = request_done;
    let head = async {
        match deadline {
            None => Ok(response.await),
            Some(d) => tokio::time::timeout(d, response)
                .await
                .map_err(|_| Status::new(Code::DEADLINE_EXCEEDED, format!("{method}: deadline of {d:?} exceeded waiting for {backend}"))),
        }
    };
    tokio::pin!(head);
    // Wait for the response head while sending the request body and watching for the client
    // to give up. Dropping the backend stream's handles on return resets it (CANCEL).
    let head = loop {
        tokio::select! {
            biased;
            sent = &mut upload, if !upload_done => {
                // A backend may answer (e.g. UNIMPLEMENTED) and close its side before reading
                // the request body; its answer is still on the way, so wait for it.
                upload_done = true;
                if let Err(e) = sent {
                    tracing::debug!(method, error = %e, "request body not fully forwarded");
                }
            }
            head = &mut head => break head,
            reason = poll_fn(|cx| respond.poll_reset(cx)) => {
                return Status::new(Code::CANCELLED, format!("client reset the call: {}", describe(reason)));
            }
        }
    };
    let resp = match head {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) if e.is_reset() && e.is_remote() => {
            // The backend reset the call: the client gets the same reset, as from the backend.
            respond.send_reset(e.reason().unwrap_or(Reason::INTERNAL_ERROR));
            return PipeError::Broken(e).into_status();
        }
        Ok(Err(e)) => {
            let status = Status::new(Code::UNAVAILABLE, format!("{method}: {backend} failed the call: {e}"));
            return reply(&mut respond, status);
        }
        Err(deadline_exceeded) => return reply(&mut respond, deadline_exceeded),
    };

    let (parts, body) = resp.into_parts();
    let mut status = Status::from_headers(&parts.headers);
    let response_done = body.is_end_stream();
    let downstream = match respond.send_response(Response::from_parts(parts, ()), response_done) {
        Ok(s) => s,
        Err(e) => return Status::new(Code::CANCELLED, format!("client went away: {e}")),
    };
    if response_done {
        return status.unwrap_or_else(missing_status);
    }
    let mut downstream = downstream;
    let download = pipe(body, &mut downstream);
    let downloaded = if upload_done { download.await } else { tokio::join!(upload, download).1 };
    match downloaded {
        Ok(Some(trailers)) => status = Status::from_headers(&trailers).or(status),
        Ok(None) => {}
        Err(PipeError::Broken(e)) if e.is_reset() && e.is_remote() => {
            // The backend reset the call: the client gets the same reset, as from the backend.
            downstream.send_reset(e.reason().unwrap_or(Reason::INTERNAL_ERROR));
            return PipeError::Broken(e).into_status();
        }
        Err(PipeError::Broken(e)) => {
            // The backend's connection broke (containerd stopped or crashed) after the response
            // head went out: end the call with trailers, as gRPC servers end a failed stream, so
            // that the client sees UNAVAILABLE naming the backend rather than a bare reset.
            let failed = Status::new(Code::UNAVAILABLE, format!("{method}: {backend} failed the call: {e}"));
            let _ = downstream.send_trailers(failed.trailers());
            return failed;
        }
        Err(e) => return e.into_status(),
    }
    status.unwrap_or_else(missing_status)
}

/// Answers the call with `status` (trailers-only) and returns it.
fn reply(respond: &mut SendResponse<Bytes>, status: Status) -> Status {
    // The client may already be gone; then there is nobody to tell.
    let _ = respond.send_response(status.trailers_only(), true);
    status
}

fn missing_status() -> Status {
    Status::new(Code::UNKNOWN, "backend ended the call without a grpc-status")
}

fn describe(reason: Result<Reason, h2::Error>) -> String {
    match reason {
        Ok(r) => r.to_string(),
        Err(e) => e.to_string(),
    }
}

/// Why a body could not be copied from one stream to the other.
#[derive(Debug)]
pub enum PipeError {
    /// The receiving side reset its stream or went away (a client giving up: the call is
    /// cancelled).
    Reset(String),
    /// The source stream broke: its peer reset it, or its connection failed.
    Broken(h2::Error),
}

impl PipeError {
    fn into_status(self) -> Status {
        match self {
            PipeError::Reset(why) => Status::new(Code::CANCELLED, format!("stream reset by the receiver: {why}")),
            PipeError::Broken(e) => Status::new(Code::UNAVAILABLE, format!("stream broken: {e}")),
        }
    }
}

impl std::fmt::Display for PipeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipeError::Reset(why) => write!(f, "reset by the receiver: {why}"),
            PipeError::Broken(e) => write!(f, "broken: {e}"),
        }
    }
}

/// Bytes of one stream [`pipe`] hands to the sending side before it waits for the receiver's
/// flow-control window to take them.
pub const UNCONFIRMED_LIMIT: usize = 64 << 10;

/// Copies a body, frame by frame, from `recv` to `send`, then its trailers (returned).
///
/// Flow control: frames are handed to `send` as soon as they arrive, so a unary call's head,
/// message and end of stream leave in one write; once [`UNCONFIRMED_LIMIT`] bytes are handed
/// over, the copy waits until the receiver's window has taken them, so a slow receiver holds
/// at most that much (plus one frame) per stream in the proxy. A reset on `send` stops the copy
/// (and dropping `recv` resets the source). A broken `recv` is returned as
/// [`PipeError::Broken`] with `send` left open: the caller ends it as its direction requires.
pub async fn pipe(mut recv: RecvStream, send: &mut SendStream<Bytes>) -> Result<Option<HeaderMap>, PipeError> {
    let mut unconfirmed = 0;
    loop {
        if unconfirmed >= UNCONFIRMED_LIMIT {
            send.reserve_capacity(1);
            poll_fn(|cx| poll_capacity(send, cx)).await?;
            unconfirmed = 0;
        }
        let next = tokio::select! {
            biased;
            next = recv.data() => next,
            reason = poll_fn(|cx| send.poll_reset(cx)) => return Err(PipeError::Reset(describe(reason))),
        };
        match next {
            Some(Ok(chunk)) => {
                let len = chunk.len();
                let end = recv.is_end_stream();
                send.send_data(chunk, end).map_err(gone)?;
                unconfirmed += len;
                let _ = recv.flow_control().release_capacity(len);
                if end {
                    return Ok(None);
                }
            }
            Some(Err(e)) => return Err(PipeError::Broken(e)),
            None => break,
        }
    }
    match recv.trailers().await {
        Ok(Some(trailers)) => {
            send.send_trailers(trailers.clone()).map_err(gone)?;
            Ok(Some(trailers))
        }
        Ok(None) => {
            send.send_data(Bytes::new(), true).map_err(gone)?;
            Ok(None)
        }
        Err(e) => Err(PipeError::Broken(e)),
    }
}

/// The receiving side could not take a frame: it is reset or its connection is gone.
fn gone(e: h2::Error) -> PipeError {
    PipeError::Reset(e.to_string())
}

/// Ready when `send` has window for at least one more byte; fails when it is reset or closed.
fn poll_capacity(send: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> Poll<Result<(), PipeError>> {
    loop {
        if send.capacity() > 0 {
            return Poll::Ready(Ok(()));
        }
        match send.poll_capacity(cx) {
            Poll::Ready(Some(Ok(0))) => continue,
            Poll::Ready(Some(Ok(_))) => return Poll::Ready(Ok(())),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(gone(e))),
            Poll::Ready(None) => return Poll::Ready(Err(PipeError::Reset("stream closed".into()))),
            Poll::Pending => {
                return match send.poll_reset(cx) {
                    Poll::Ready(reason) => Poll::Ready(Err(PipeError::Reset(describe(reason)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// A unary answer collected whole from the backend (for intercepted calls, whose answer the
/// store learns from).
#[derive(Debug)]
pub struct Answer {
    /// Response head (status and headers) as the backend sent it.
    pub head: Response<()>,
    /// The body bytes (gRPC length-prefixed messages).
    pub data: Bytes,
    /// The trailers, absent for a trailers-only answer.
    pub trailers: Option<HeaderMap>,
}

impl Answer {
    /// The call's status, from the trailers or a trailers-only head; `UNKNOWN` when neither
    /// carries `grpc-status`.
    pub fn status(&self) -> Status {
        self.grpc_status().unwrap_or_else(missing_status)
    }

    /// The status the trailers or a trailers-only head carry; `None` without `grpc-status`.
    pub fn grpc_status(&self) -> Option<Status> {
        self.trailers.as_ref().and_then(Status::from_headers).or_else(|| Status::from_headers(self.head.headers()))
    }

    /// The answer's one message, decompressed per its `grpc-encoding` (see
    /// [`grpc::unary_message`]) up to `limit` bytes; `Ok(None)` when the body is not exactly one
    /// message.
    ///
    /// Errors: as [`grpc::unary_message`] (an encoding the proxy cannot decompress, a corrupt
    /// message, more than `limit` bytes).
    pub fn message(&self, limit: usize) -> Result<Option<Bytes>, Status> {
        grpc::unary_message(&self.data, self.head.headers().get("grpc-encoding"), limit)
    }

    /// Sends the answer to the client unchanged; returns its status.
    pub fn send(self, respond: &mut SendResponse<Bytes>) -> Status {
        let status = self.status();
        let only_head = self.data.is_empty() && self.trailers.is_none();
        let mut stream = match respond.send_response(self.head, only_head) {
            Ok(s) => s,
            Err(e) => return Status::new(Code::CANCELLED, format!("client went away: {e}")),
        };
        if only_head {
            return status;
        }
        let sent = match self.trailers {
            Some(t) => stream.send_data(self.data, false).and_then(|()| stream.send_trailers(t)),
            None => stream.send_data(self.data, true),
        };
        match sent {
            Ok(()) => status,
            Err(e) => Status::new(Code::CANCELLED, format!("client went away: {e}")),
        }
    }
}

/// Sends one unary call (`head` and the whole `body`) to `backend` and collects the answer.
///
/// Errors: as [`forward`] (`UNAVAILABLE`, `DEADLINE_EXCEEDED` when `deadline` passes first).
pub async fn unary(backend: &Backend, head: Request<()>, body: Bytes, deadline: Option<Duration>, method: &str) -> Result<Answer, Status> {
    let call = exchange(backend, head, body, method, usize::MAX);
    match deadline {
        None => call.await,
        Some(d) => tokio::time::timeout(d, call)
            .await
            .map_err(|_| Status::new(Code::DEADLINE_EXCEEDED, format!("{method}: deadline exceeded waiting for {backend}")))?,
    }
}

/// Sends one unary call (`head` and the whole `body`, in one write when the connection is
/// idle) to `backend` and collects the answer, whose body may hold at most one message of
/// `max_message` bytes (plus its 5-byte prefix). No deadline of its own: the caller bounds it
/// (dropping the future resets the stream).
///
/// Errors: `UNAVAILABLE` naming `method` and the backend when it cannot be reached or fails
/// the call (a reset, a broken connection); `RESOURCE_EXHAUSTED` as soon as the answer's body
/// exceeds `max_message` + 5 bytes (the stream is reset; at most one frame more is read).
pub async fn exchange(backend: &Backend, head: Request<()>, body: Bytes, method: &str, max_message: usize) -> Result<Answer, Status> {
    let (response, mut upstream) = backend.open_stream(head, body.is_empty()).await?;
    if !body.is_empty() {
        // Ignored: a backend that answers before reading the body still answers.
        let _ = upstream.send_data(body, true);
    }
    let failed = |e: h2::Error| Status::new(Code::UNAVAILABLE, format!("{method}: {backend} failed the call: {e}"));
    let (head, mut recv) = response.await.map_err(failed)?.into_parts();
    let max_data = max_message.saturating_add(5);
    // The usual unary answer is one DATA frame: kept as it came, without a copy.
    let (mut first, mut joined) = (Bytes::new(), bytes::BytesMut::new());
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(failed)?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        let have = if joined.is_empty() { first.len() } else { joined.len() };
        if have + chunk.len() > max_data {
            return Err(Status::new(
                Code::RESOURCE_EXHAUSTED,
                format!("{method}: answer from {backend} larger than one message of {max_message} bytes"),
            ));
        }
        if have == 0 {
            first = chunk;
        } else {
            if joined.is_empty() {
                joined.extend_from_slice(&first);
            }
            joined.extend_from_slice(&chunk);
        }
    }
    let data = if joined.is_empty() { first } else { joined.freeze() };
    let trailers = recv.trailers().await.map_err(failed)?;
    Ok(Answer { head: Response::from_parts(head, ()), data, trailers })
}
